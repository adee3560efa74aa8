// Slots two rows would both touch, on the host backend (where the indices are
// host memory and can be read before anything runs): refused, naming the
// argument and the rows, with not one byte of o, the pools or the counter
// changed. Sharing a slot that no row writes stays allowed (forks), and so do
// repeated padding or out-of-range indices, which write nothing.
#include <cstring>
#include <vector>

#include "random_case.hpp"

namespace gdn_test {
namespace {

struct Slots {
  std::vector<int32_t> in, out;  // out empty: in place
};

CaseSpec conflict_spec(bool split, bool conv) {
  CaseSpec s;
  s.name = "slot_conflicts";
  s.seed = 54;
  s.batch = 4;
  s.index = gdn::IndexType::kI32;
  s.extra_slots = 4;  // 8 slots: room for every pattern below
  s.out_indices = split;
  if (conv) {
    s.conv_width = 4;
    s.conv_bias = true;
  }
  return s;
}

// Runs the case with the given slots; returns decode's status. `changed` tells
// whether any output, pool or counter byte moved.
gdn::Status run_with(const Slots& slots, bool conv, bool* changed) {
  const bool split = !slots.out.empty();
  const HostCase hc = make_case(conflict_spec(split, conv));
  DeviceCase dc(hc, gdn::Backend::kHost);
  std::memcpy(dc.in_idx.get(), slots.in.data(), slots.in.size() * sizeof(int32_t));
  if (split) std::memcpy(dc.out_idx.get(), slots.out.data(), slots.out.size() * sizeof(int32_t));
  const std::vector<uint8_t> o0 = dc.o.download(), s0 = dc.state.download(), c0 = dc.counter.download();
  const std::vector<uint8_t> cv0 = conv ? dc.conv_state.download() : std::vector<uint8_t>{};
  const gdn::Status st = dc.run();
  *changed = dc.o.download() != o0 || dc.state.download() != s0 || dc.counter.download() != c0 ||
             (conv && dc.conv_state.download() != cv0);
  return st;
}

void expect_refused(const Slots& slots, bool conv, std::initializer_list<const char*> needles) {
  bool changed = true;
  const gdn::Status st = run_with(slots, conv, &changed);
  EXPECT_EQ(st.code, gdn::StatusCode::kInvalidArgument) << st.message;
  for (const char* n : needles)
    EXPECT_TRUE(contains(st.message, n)) << "message \"" << st.message << "\" lacks \"" << n << "\"";
  EXPECT_FALSE(changed) << "a refused call wrote";
}

void expect_accepted(const Slots& slots, bool conv) {
  bool changed = false;
  const gdn::Status st = run_with(slots, conv, &changed);
  EXPECT_TRUE(st.ok()) << st.message;
  EXPECT_TRUE(changed) << "an accepted call wrote nothing";
}

class SlotConflicts : public ::testing::TestWithParam<bool> {};  // param: conv prologue on

TEST_P(SlotConflicts, TwoRowsUpdatingOneSlotInPlace) {
  expect_refused({{3, 1, 1, 0}, {}}, GetParam(), {"state_indices", "rows 1 and 2", "slot 1"});
}

TEST_P(SlotConflicts, TwoRowsWritingOneSlot) {
  expect_refused({{0, 1, 2, 3}, {5, 6, 5, 7}}, GetParam(),
                 {"state_out_indices", "rows 0 and 2", "slot 5"});
}

TEST_P(SlotConflicts, ARowReadingWhatAnotherWrites) {
  // row 0 steps 1 -> 2 while row 3 reads 2: a race on a GPU
  expect_refused({{1, 4, 5, 2}, {2, 6, 7, 3}}, GetParam(),
                 {"state_indices", "row 3 reads slot 2", "row 0 writes"});
}

TEST_P(SlotConflicts, SharedReadSlotWithDistinctWritesIsAFork) {
  expect_accepted({{1, 1, 1, 4}, {2, 3, 5, 6}}, GetParam());
}

TEST_P(SlotConflicts, SteppingEachRowToAnotherSlotOfItsOwn) {
  // a double-buffered pool: each row reads one slot and writes its twin
  expect_accepted({{0, 1, 2, 3}, {4, 5, 6, 7}}, GetParam());
  // and writing back to the slot a row itself read
  expect_accepted({{0, 1, 2, 3}, {0, 5, 2, 7}}, GetParam());
}

TEST_P(SlotConflicts, RepeatedPaddingAndOutOfRangeWriteNothingAndPass) {
  expect_accepted({{-1, 2, -1, 3}, {}}, GetParam());
  expect_accepted({{9, 2, 9, 3}, {}}, GetParam());  // counted twice, written never
  // padding read: the row's write slot is never written, so it may repeat another's
  expect_accepted({{-1, 2, 4, 3}, {5, 5, 6, 7}}, GetParam());
  expect_accepted({{0, 2, 4, 3}, {-1, 5, -1, 7}}, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Host, SlotConflicts, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? std::string("Conv") : std::string("Plain");
                         });

}  // namespace
}  // namespace gdn_test
