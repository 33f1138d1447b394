// The sum tree's two loops, shared by the plain C library (sum_tree.cc, called from NumPy through ctypes) and
// the TF ops (sum_tree_ops.cc). tfreplay/core/samplers/sum_tree.py runs the same arithmetic with array ops, in
// the same order, so both paths give bit-identical trees and draws.
//
// Layout: `tree` holds 2 * leaves doubles (leaves a power of two); node 1 is the root, node k has children 2k
// and 2k + 1, and row r's leaf is node leaves + r. Both loops go level by level over the whole batch: the loads
// of one level are independent of each other, so their cache misses overlap.

#ifndef TFREPLAY_KERNELS_SUM_TREE_H_
#define TFREPLAY_KERNELS_SUM_TREE_H_

#include <cstdint>

namespace tfreplay {

// For each target mass u (in [0, tree[1])), the row whose leaf holds it and that leaf's value. `node` is
// scratch of `size` entries (it may be `rows`).
inline void SumTreeDescend(const double* tree, int64_t leaves, const double* targets, int64_t size, int64_t* node,
                           double* rest, int64_t* rows, double* mass) {
  for (int64_t b = 0; b < size; ++b) {
    node[b] = 1;
    rest[b] = targets[b];
  }
  for (int64_t width = 1; width < leaves; width *= 2) {
    for (int64_t b = 0; b < size; ++b) {
      const double left = tree[2 * node[b]];
      const bool right = rest[b] >= left;
      rest[b] = right ? rest[b] - left : rest[b];
      node[b] = 2 * node[b] + (right ? 1 : 0);
    }
  }
  for (int64_t b = 0; b < size; ++b) {
    mass[b] = tree[node[b]];
    rows[b] = node[b] - leaves;
  }
}

// Writes leaves (of duplicate rows, the last value wins), then each level's touched sums from their children,
// bottom up: a sum is recomputed only after every child below it, so duplicates are harmless. `node` is
// scratch of `size` entries.
inline void SumTreeSet(double* tree, int64_t leaves, const int64_t* rows, const double* values, int64_t size,
                       int64_t* node) {
  for (int64_t i = 0; i < size; ++i) {
    tree[leaves + rows[i]] = values[i];
    node[i] = leaves + rows[i];
  }
  for (int64_t width = 1; width < leaves; width *= 2) {
    for (int64_t i = 0; i < size; ++i) {
      const int64_t parent = node[i] / 2;
      // Rows of a sample come sorted, so near the root most parents were just summed for the row before.
      if (i == 0 || parent != node[i - 1]) tree[parent] = tree[2 * parent] + tree[2 * parent + 1];
      node[i] = parent;
    }
  }
}

// Division by a layout size; a power of two (the usual layout) takes a shift and a mask instead.
class Divisor {
 public:
  explicit Divisor(int64_t d) : d_(d), shift_(-1) {
    if (d > 0 && (d & (d - 1)) == 0) shift_ = __builtin_ctzll(static_cast<unsigned long long>(d));
  }
  int64_t Div(int64_t x) const { return shift_ >= 0 ? x >> shift_ : x / d_; }  // x >= 0
  int64_t Mod(int64_t x) const { return shift_ >= 0 ? x & (d_ - 1) : x % d_; }  // x >= 0

 private:
  int64_t d_;
  int shift_;
};

// Ring windows (no episode index, see tfreplay/core/ring.py): draws `size` leaves, at targets
// ((b + uniform[b]) / size) * tree[1] (stratified) or uniform[b] * tree[1], and for each its segment, the live
// id `t` stored there, its leaf value and whether a window of `num_steps` starts there (inside the live range,
// leaf > 0). As PrioritizedSampler._draw computes it. `node` and `rest` are scratch of `size` entries.
inline void RingDraw(const double* tree, int64_t leaves, const int64_t* num_adds, int64_t num_segments,
                     int64_t max_length, int64_t num_steps, const double* uniform, int64_t size, bool stratified,
                     int64_t* node, double* rest, int64_t* segment, int64_t* t, double* leaf, bool* ok) {
  const double mass = tree[1];
  for (int64_t b = 0; b < size; ++b) {
    rest[b] = stratified ? (static_cast<double>(b) + uniform[b]) / static_cast<double>(size) * mass : uniform[b] * mass;
  }
  SumTreeDescend(tree, leaves, rest, size, node, rest, node, leaf);
  const int64_t last = num_segments * max_length - 1;
  const Divisor segments(num_segments), length(max_length);
  for (int64_t b = 0; b < size; ++b) {
    const int64_t row = node[b] < last ? node[b] : last;  // past the rows: a padding leaf of value 0
    const int64_t seg = segments.Mod(row), slot = segments.Div(row), adds = num_adds[seg];
    const int64_t back = length.Mod(adds - 1 - slot + max_length);  // floor modulo (adds - 1 - slot >= -max_length)
    const int64_t id = adds - 1 - back;  // the live id stored in that slot
    const int64_t oldest = adds - (adds < max_length ? adds : max_length);
    segment[b] = seg;
    t[b] = id;
    ok[b] = id >= oldest && id + num_steps - 1 < adds && leaf[b] > 0;
  }
}

// Ring windows: gives the live ones of global `ids` (id = local * num_segments + segment) their `values`
// (priority ** alpha); stale ids (overwritten, or not written yet) change nothing. Of duplicate rows the last
// live value wins. Returns how many ids were stale and the largest priority of a live id (0 if none).
// `rows` and `kept` are scratch of `size` entries.
inline void RingUpdate(double* tree, int64_t leaves, const int64_t* num_adds, int64_t num_segments, int64_t max_length,
                       const int64_t* ids, const double* values, const double* priorities, int64_t size,
                       int64_t* rows, double* kept, int64_t* node, int64_t* stale, double* largest) {
  int64_t live = 0;
  double most = 0.0;
  for (int64_t i = 0; i < size; ++i) {
    const int64_t seg = ((ids[i] % num_segments) + num_segments) % num_segments;
    const int64_t local = (ids[i] - seg) / num_segments;
    const int64_t adds = num_adds[seg];
    const int64_t oldest = adds - (adds < max_length ? adds : max_length);
    if (local < oldest || local >= adds) continue;
    rows[live] = (local % max_length) * num_segments + seg;
    kept[live] = values[i];
    most = priorities[i] > most ? priorities[i] : most;
    ++live;
  }
  SumTreeSet(tree, leaves, rows, kept, live, node);
  *stale = size - live;
  *largest = most;
}

}  // namespace tfreplay

#endif  // TFREPLAY_KERNELS_SUM_TREE_H_
