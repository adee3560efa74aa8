#!/usr/bin/env python3
"""The occupancy half of an H200's DeviceInfo (backends/cuda/plan.h), for the
planner's CPU test: warps an SM holds of each plain step kernel and of the
one-wave kernel, computed as the CUDA occupancy calculator does (sm_90: 64
warps, 32 blocks, 65536 registers in 256-register warp units, 228 KiB of
shared memory with 1 KiB reserved a block) from each kernel's registers and
static shared memory as ptxas reports them, and its dynamic shared memory
(backends/cuda/traits.h). The library reads the same numbers from the
driver at run time (device.cu).

    for f in backends/cuda/instantiate/*.cu; do
      nvcc -std=c++17 --expt-relaxed-constexpr -Xptxas -v -arch=sm_90 -Icore/include \
           -c $f -o /dev/null 2> /tmp/ptxas_$(basename $f .cu).log; done
    python3 tools/plan_device_table.py /tmp/ptxas_*.log > tests/plan_h200_device.inc
"""
import re
import subprocess
import sys
logs = sys.argv[1:]
props = {}
cur = None
for f in logs:
    for line in open(f):
        m = re.search(r'Function properties for (\S+)', line)
        if m: cur = m.group(1); continue
        m = re.search(r'Used (\d+) registers', line)
        if m and cur:
            smem = re.search(r'(\d+) bytes smem', line)
            props[cur] = (int(m.group(1)), int(smem.group(1)) if smem else 0)
            cur = None
names = list(props)
dem = subprocess.run(['c++filt'], input='\n'.join(names), capture_output=True, text=True).stdout.split('\n')
table = {}
for mangled, d in zip(names, dem):
    table[d[:d.index('>(')+1].replace('void ', '').strip()] = props[mangled]
def occ(regs, static, dyn, warps):
    per_warp = -(-regs * 32 // 256) * 256
    b_regs = (65536 // per_warp) // warps
    b = min(32, 64 // warps, b_regs)
    if static + dyn > 0:
        per_block = -(-(static + dyn + 1024) // 128) * 128
        b = min(b, 233472 // per_block)
    return max(b, 1) * warps
T = {0: 'float', 1: '__half', 2: '__nv_bfloat16'}
IO = {0: 'float', 1: '__half', 2: '__nv_bfloat16', 3: 'gdn::cuda::MixedIO'}
sizes = {0: 4, 1: 2, 2: 2}
out = []
missing = 0
for s in range(3):
    for l in range(2):
        for k, dk in enumerate((64, 128, 256)):
            for small in range(2):
                for io in range(4):
                    if l == 0:
                        if small: out.append(f'd.step_warps[{s}][{l}][{k}][{small}][{io}] = 1;'); continue
                        p = 16 if s == 0 else 32
                        name = f'gdn::cuda::decode_vk_step_kernel<{T[s]}, (gdn::Layout)1, {dk}, {p}, {IO[io]}, 0, false>'
                        vec = 16 // sizes[s]; chunks = dk // vec; lanes = min(chunks, 32); per = chunks // lanes
                        unroll = max(p // (per * vec), 1)
                        dyn = 8 * 2 * 32 * 16 * unroll * per; warps = 8
                    else:
                        w = 4 if small else 8
                        name = f'gdn::cuda::decode_kv_step_kernel<{T[s]}, {dk}, {w}, {IO[io]}, 0, false>'
                        st = 3 if sizes[s] == 4 else 2
                        if dk <= 64 and st == 2: st = 3
                        dyn = st * (dk // 32) * (w * 32) * 16; warps = w
                    if name not in table:
                        missing += 1
                        print('missing', name, file=sys.stderr)
                        continue
                    r, st_ = table[name]
                    out.append(f'd.step_warps[{s}][{l}][{k}][{small}][{io}] = {occ(r, st_, dyn, warps)};  // {r} regs')
for s in range(3):
    for io in range(4):
        for x in range(2):
            name = f'gdn::cuda::decode_vk_wave_kernel<{T[s]}, {IO[io]}, 1, {"true" if x else "false"}, false>'
            if name not in table: out.append(f'd.wave_warps[{s}][{io}][{x}] = 8;'); continue
            r, st_ = table[name]
            out.append(f'd.wave_warps[{s}][{io}][{x}] = {occ(r, st_, 0, 8)};  // {r} regs')
print('\n'.join(out))
if missing:
    sys.exit(f'{missing} kernels missing from the logs')
