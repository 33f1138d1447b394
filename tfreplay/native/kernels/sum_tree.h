// The sum tree's loops, shared by the plain C library (sum_tree.cc, called from NumPy through ctypes) and
// the TF ops (sum_tree_ops.cc). tfreplay/_src/samplers/sum_tree.py runs the same arithmetic with array ops, in
// the same order, so both paths give bit-identical trees and draws.
//
// Layout: `tree` holds 2 * leaves doubles (leaves a power of two) and row r's leaf is node leaves + r. Node 1
// is the root; a node k of fanout f has children f * k ... f * k + f - 1. Every node has kFanout (8) children,
// 64 bytes, one cache line, except the root, which has 2, 4 or 8 (leaves = root fanout * 8^levels). The nodes
// of a level of n nodes are [n, 2n): levels never overlap, and the leaves stay contiguous. A node's value is
// the sum of its children added first to last; a descent compares its target with those running sums. A 1M-row tree is 7 levels deep instead of 20: a descent misses the cache
// once per level, and the comparisons within a node do not wait on each other.
//
// Both loops go level by level over the whole batch: the loads of one level are independent of each other, so
// their cache misses overlap.

#ifndef TFREPLAY_KERNELS_SUM_TREE_H_
#define TFREPLAY_KERNELS_SUM_TREE_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace tfreplay {

constexpr int64_t kFanout = 8;

// The root's fanout: leaves / 8^levels, in {2, 4, 8} (1 for a tree of one leaf, which is its own root).
inline int64_t RootFanout(int64_t leaves) {
  int64_t f = leaves;
  while (f > kFanout) f /= kFanout;
  return f;
}

// One level of a descent through nodes of fanout F, for `Lanes` draws side by side: at a node the target
// passes child j while it is at least the running sum of children 0..j; the last child takes what is left (a
// target past the sum lands there). A draw's running sums form one chain of dependent additions; several
// draws interleaved give the CPU independent chains to overlap (each draw's arithmetic is unchanged).
template <int64_t F, int Lanes>
inline void DescendLanes(const double* tree, int64_t* node, double* rest, bool prefetch) {
  const double* child[Lanes];
  double u[Lanes], running[Lanes], passed[Lanes];
  int64_t j[Lanes];
  for (int l = 0; l < Lanes; ++l) {
    child[l] = tree + F * node[l];
    u[l] = rest[l];
    running[l] = child[l][0];
    passed[l] = 0.0;
    j[l] = 0;
  }
  for (int64_t i = 0; i + 1 < F; ++i) {
    for (int l = 0; l < Lanes; ++l) {
      if (i > 0) running[l] = running[l] + child[l][i];
      const bool past = u[l] >= running[l];  // running sums only grow: the passed ones come first
      j[l] += past ? 1 : 0;
      passed[l] = past ? running[l] : passed[l];
    }
  }
  for (int l = 0; l < Lanes; ++l) {
    rest[l] = j[l] > 0 ? u[l] - passed[l] : u[l];
    node[l] = F * node[l] + j[l];
    // The next level reads this node's children: start loading them now, while the other draws descend.
    if (prefetch) __builtin_prefetch(tree + kFanout * node[l]);
  }
}

template <int64_t F>
inline void DescendLevel(const double* tree, int64_t size, int64_t* node, double* rest, bool prefetch) {
  constexpr int kLanes = 4;
  const int64_t whole = size - size % kLanes;
  for (int64_t b = 0; b < whole; b += kLanes) DescendLanes<F, kLanes>(tree, node + b, rest + b, prefetch);
  for (int64_t b = whole; b < size; ++b) DescendLanes<F, 1>(tree, node + b, rest + b, prefetch);
}

// For each target mass u (in [0, tree[1])), the row whose leaf holds it and that leaf's value. `node` is
// scratch of `size` entries (it may be `rows`).
inline void SumTreeDescend(const double* tree, int64_t leaves, const double* targets, int64_t size, int64_t* node,
                           double* rest, int64_t* rows, double* mass) {
  for (int64_t b = 0; b < size; ++b) {
    node[b] = 1;
    rest[b] = targets[b];
  }
  const int64_t root = RootFanout(leaves);
  if (leaves > 1) {
    if (root == 2) DescendLevel<2>(tree, size, node, rest, root < leaves);
    if (root == 4) DescendLevel<4>(tree, size, node, rest, root < leaves);
    if (root == 8) DescendLevel<8>(tree, size, node, rest, root < leaves);
  }
  for (int64_t width = root; width < leaves; width *= kFanout) {
    DescendLevel<kFanout>(tree, size, node, rest, width * kFanout < leaves);
  }
  for (int64_t b = 0; b < size; ++b) {
    mass[b] = tree[node[b]];
    rows[b] = node[b] - leaves;
  }
}

// The sum of `f` children, first to last. (Not in pairs: TF's graph optimizer turns a tree of additions into
// one AddN, which adds first to last, so the array-op fallback could not keep another order.)
inline double ChildSum(const double* child, int64_t f) {
  double sum = child[0];
  for (int64_t j = 1; j < f; ++j) sum = sum + child[j];
  return sum;
}

// Recomputes the parents of `node` (nodes of fanout f) from their children and moves `node` up to them.
inline void SetLevel(double* tree, int64_t f, int64_t size, int64_t* node) {
  for (int64_t i = 0; i < size; ++i) {
    const int64_t parent = node[i] / f;
    // Rows of a sample come sorted, so near the root most parents were just summed for the row before.
    if (i == 0 || parent != node[i - 1]) tree[parent] = f == kFanout ? ChildSum(tree + f * parent, kFanout)
                                                                        : ChildSum(tree + f * parent, f);
    node[i] = parent;
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
  const int64_t root = RootFanout(leaves);
  for (int64_t width = leaves; width > 1;) {  // `width` nodes on the level below the one summed now
    if (width == root) {
      SetLevel(tree, root, size, node);
      break;
    }
    SetLevel(tree, kFanout, size, node);
    width /= kFanout;
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

// Ring windows (no episode index, see tfreplay/_src/index/ring.py): draws `size` leaves, at targets
// ((b + uniform[b]) / size) * tree[1] (stratified) or uniform[b] * tree[1], and for each its segment, the live
// id `t` stored there, its leaf value and whether a window of `num_steps` starts there (inside the live range,
// leaf > 0). As PrioritizedSampler._draw computes it; returns whether a window starts at every draw. `node`
// and `rest` are scratch of `size` entries.
inline bool RingDraw(const double* tree, int64_t leaves, const int64_t* num_adds, int64_t num_segments,
                     int64_t max_length, int64_t num_steps, const double* uniform, int64_t size, bool stratified,
                     int64_t* node, double* rest, int64_t* segment, int64_t* t, double* leaf, bool* ok) {
  const double mass = tree[1];
  for (int64_t b = 0; b < size; ++b) {
    rest[b] = stratified ? (static_cast<double>(b) + uniform[b]) / static_cast<double>(size) * mass : uniform[b] * mass;
  }
  SumTreeDescend(tree, leaves, rest, size, node, rest, node, leaf);
  const int64_t last = num_segments * max_length - 1;
  const Divisor segments(num_segments), length(max_length);
  bool all = true;
  for (int64_t b = 0; b < size; ++b) {
    const int64_t row = node[b] < last ? node[b] : last;  // past the rows: a padding leaf of value 0
    const int64_t seg = segments.Mod(row), slot = segments.Div(row), adds = num_adds[seg];
    const int64_t back = length.Mod(adds - 1 - slot + max_length);  // floor modulo (adds - 1 - slot >= -max_length)
    const int64_t id = adds - 1 - back;  // the live id stored in that slot
    const int64_t oldest = adds - (adds < max_length ? adds : max_length);
    segment[b] = seg;
    t[b] = id;
    ok[b] = id >= oldest && id + num_steps - 1 < adds && leaf[b] > 0;
    all &= ok[b];
  }
  return all;
}

// The drawable mass counts as none below this share of the tree's sum (prioritized.py's _EMPTY_SHARE).
constexpr double kEmptyShare = 1e-12;

// Ring windows of one item: RingDraw (stratified), plus each draw's probability `leaf / mass` as float32 and
// whether anything can be drawn (`*count`, 0 or 1; when 0 the probabilities divide by mass + 1 instead), all
// from one read of the tree. As PrioritizedSampler.sample computes them; returns whether a window starts at
// every draw (else the caller draws again).
inline bool RingSample(const double* tree, int64_t leaves, const int64_t* num_adds, int64_t num_segments,
                       int64_t max_length, const double* uniform, int64_t size, int64_t* node, double* rest,
                       int64_t* segment, int64_t* t, double* leaf, bool* ok, float* probs, int64_t* count) {
  const bool all = RingDraw(tree, leaves, num_adds, num_segments, max_length, 1, uniform, size, true, node, rest,
                            segment, t, leaf, ok);
  const double mass = tree[1];
  *count = mass > mass * kEmptyShare ? 1 : 0;
  const double total = mass + (*count > 0 ? 0.0 : 1.0);
  for (int64_t b = 0; b < size; ++b) probs[b] = static_cast<float>(leaf[b] / total);
  return all;
}

// Whether every priority is finite and non-negative and its value (priority ** alpha) small enough that a tree of
// `leaves` such values sums finitely (an update with another changes nothing). A negative priority is one whose
// sign bit is set, -0.0 aside: a negative subnormal counts as negative whatever the float mode (a thread that
// flushes denormals to zero would compare it as 0).
inline bool PrioritiesOk(const double* priorities, const double* values, int64_t size, int64_t leaves) {
  const double most = std::numeric_limits<double>::max() / (2.0 * static_cast<double>(leaves));
  bool ok = true;
  for (int64_t i = 0; i < size; ++i) {
    uint64_t bits;
    std::memcpy(&bits, &priorities[i], sizeof bits);
    const bool negative = (bits >> 63) != 0 && (bits << 1) != 0;
    ok &= std::isfinite(priorities[i]) && !negative && values[i] <= most;
  }
  return ok;
}

// Ring windows: gives the live ones of global `ids` (id = local * num_segments + segment) their `values`
// (priority ** alpha); stale ids (overwritten, or not written yet) change nothing. Of duplicate rows the last
// live value wins. Raises `*max_priority` to the largest priority of a live id and returns how many ids were
// stale. The caller has checked the priorities and values (PrioritiesOk). `rows`, `kept` and `node` are scratch of
// `size` entries.
inline int64_t RingUpdate(double* tree, int64_t leaves, const int64_t* num_adds, int64_t num_segments,
                          int64_t max_length, const int64_t* ids, const double* values, const double* priorities,
                          int64_t size, int64_t* rows, double* kept, int64_t* node, double* max_priority) {
  int64_t live = 0;
  double most = 0.0;
  const Divisor segments(num_segments), length(max_length);
  for (int64_t i = 0; i < size; ++i) {
    if (ids[i] < 0) continue;  // never an item's id
    const int64_t seg = segments.Mod(ids[i]), local = segments.Div(ids[i]);
    const int64_t adds = num_adds[seg];
    const int64_t oldest = adds - (adds < max_length ? adds : max_length);
    if (local < oldest || local >= adds) continue;
    rows[live] = length.Mod(local) * num_segments + seg;
    kept[live] = values[i];
    most = priorities[i] > most ? priorities[i] : most;
    ++live;
  }
  SumTreeSet(tree, leaves, rows, kept, live, node);
  *max_priority = most > *max_priority ? most : *max_priority;
  return size - live;
}

}  // namespace tfreplay

#endif  // TFREPLAY_KERNELS_SUM_TREE_H_
