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
      tree[parent] = tree[2 * parent] + tree[2 * parent + 1];
      node[i] = parent;
    }
  }
}

}  // namespace tfreplay

#endif  // TFREPLAY_KERNELS_SUM_TREE_H_
