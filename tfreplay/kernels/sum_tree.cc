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

}  // extern "C"
