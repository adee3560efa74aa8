/* The C API from an installed package, compiled as C. */
#include <gdnkit/gdnkit.h>
#include <stdio.h>

int main(void) {
  gdn_decode_params p;
  char msg[256];
  int rc;
  gdn_decode_params_init(&p);
  p.batch = 1;
  p.num_k_heads = 1;
  p.num_v_heads = 1;
  p.head_dim_k = 64;
  p.head_dim_v = 64;
  /* no tensors given: validation must refuse, naming the first null pointer */
  rc = gdn_decode(&p, GDN_BACKEND_HOST, msg, sizeof msg);
  printf("consumer_c: gdnkit %s, refused with %d: %s\n", gdn_version(), rc, msg);
  return rc == GDN_INVALID_ARGUMENT ? 0 : 1;
}
