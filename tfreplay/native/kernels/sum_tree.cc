// The sum tree's loops (sum_tree.h) with a plain C ABI, for the NumPy twin through ctypes. No TF dependency.
// The caller checks rows and targets; scratch is allocated here.

#include <vector>

#include "sum_tree.h"

extern "C" {

void tfreplay_sum_tree_descend(const double* tree, int64_t leaves, const double* targets, int64_t size,
                               int64_t* rows, double* mass) {
  std::vector<double> rest(size);
  tfreplay::SumTreeDescend(tree, leaves, targets, size, rows, rest.data(), rows, mass);
}

void tfreplay_sum_tree_set(double* tree, int64_t leaves, const int64_t* rows, const double* values,
                           int64_t size) {
  std::vector<int64_t> node(size);
  tfreplay::SumTreeSet(tree, leaves, rows, values, size, node.data());
}

bool tfreplay_ring_draw(const double* tree, int64_t leaves, const int64_t* num_adds, int64_t num_segments,
                        int64_t max_length, int64_t num_steps, const double* uniform, int64_t size, bool stratified,
                        int64_t* segment, int64_t* t, double* leaf, bool* ok) {
  std::vector<int64_t> node(size);
  std::vector<double> rest(size);
  return tfreplay::RingDraw(tree, leaves, num_adds, num_segments, max_length, num_steps, uniform, size, stratified,
                            node.data(), rest.data(), segment, t, leaf, ok);
}

// Returns whether every draw starts a window (bit 0) and whether anything can be drawn (bit 1).
int64_t tfreplay_ring_sample(const double* tree, int64_t leaves, const int64_t* num_adds, int64_t num_segments,
                             int64_t max_length, const double* uniform, int64_t size, int64_t* segment, int64_t* t,
                             double* leaf, bool* ok, float* probs) {
  std::vector<int64_t> node(size);
  std::vector<double> rest(size);
  int64_t count = 0;
  const bool all = tfreplay::RingSample(tree, leaves, num_adds, num_segments, max_length, uniform, size, node.data(),
                                        rest.data(), segment, t, leaf, ok, probs, &count);
  return (all ? 1 : 0) | (count << 1);
}

// Returns how many ids were stale, or -1 (nothing changed) when a priority is negative, NaN or infinite.
int64_t tfreplay_ring_update(double* tree, int64_t leaves, const int64_t* num_adds, int64_t num_segments,
                             int64_t max_length, const int64_t* ids, const double* values, const double* priorities,
                             int64_t size, double* max_priority) {
  if (!tfreplay::PrioritiesOk(priorities, values, size, leaves)) return -1;
  std::vector<int64_t> rows(size), node(size);
  std::vector<double> kept(size);
  return tfreplay::RingUpdate(tree, leaves, num_adds, num_segments, max_length, ids, values, priorities, size,
                              rows.data(), kept.data(), node.data(), max_priority);
}

// The key of the sources this library was built from (tfreplay/native/_sources.py): the loader skips a library
// whose key is not its sources' key, so a build left over from older sources is never used.
#ifndef TFREPLAY_SOURCE_KEY
#define TFREPLAY_SOURCE_KEY ""
#endif
const char* tfreplay_sum_tree_source_key() { return TFREPLAY_SOURCE_KEY; }

}  // extern "C"
