// The NumPy twin's window plan for transforms (n-step returns, sequences), with a plain C ABI for ctypes; no TF
// dependency. tfreplay/_src/sample.py (with samplers/uniform.py and index/episodes.py) computes the same with
// array ops (the fallback, and the TF twin); tfreplay/_src/backends/numpy_windows.py calls these. Both give the
// same samples from the same random draws.
//
// Layout (tfreplay/_src/index/ring.py): segment s's local id i lives in row (i mod max_length) * num_segments
// + s. A `[B, n]` plan is written time-major, `[n, B]` in memory, as the NumPy path lays it out.

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

// Python's `%`: the result has the sign of the divisor.
inline int64_t FloorMod(int64_t a, int64_t b) {
  const int64_t r = a % b;
  return r < 0 ? r + b : r;
}

// A window of `m` items through the episode index (`episodes.Shape`: `lead`, `history`): its start `t`, the
// `pos` of its end item, and its segment's oldest live id. `Shape.is_valid`.
struct Shape {
  int64_t lead, history, m;
  bool IsValid(int64_t t, int64_t end_pos, int64_t min_id) const {
    const int64_t end = t + m - 1;
    return end_pos >= m - 1 + lead && (t - history >= min_id || end - end_pos >= min_id);
  }
};

}  // namespace

extern "C" {

// The uniform padded draw over rows (no lead, no history), up to its random numbers: per segment the first
// start (`start`) and how many starts follow (`counts`): its live items less `episodes.young_starts`, from the
// index's `newest` ([num_segments, 2]: pos and ended of each segment's newest item). Returns their sum.
int64_t tfreplay_padded_counts(const int64_t* num_adds, int64_t num_segments, int64_t max_length, int64_t num_steps,
                               const int32_t* newest, int64_t* start, int64_t* counts) {
  int64_t total = 0;
  for (int64_t s = 0; s < num_segments; ++s) {
    const int64_t num_live = std::min(num_adds[s], max_length);
    const int64_t pos = newest[2 * s];
    const int64_t drawable = pos < num_live ? pos + 1 : num_live;
    const int64_t young = newest[2 * s + 1] > 0 ? 0 : std::min(std::max<int64_t>(drawable, 0), num_steps - 1);
    start[s] = num_adds[s] - num_live;
    counts[s] = std::max<int64_t>(num_live - young, 0);
    total += counts[s];
  }
  return total;
}

// Windows of `num_steps` items at local ids `t` of `segment` (`size` of them): their rows and, per window, its
// first item's global id, its mask (item stored, and with `pos` given a step of the first item's episode: `pos`
// one more per step), its last real step (mask count - 1) and that step's row. With `draws` given, `segment`
// and `t` are outputs first: each draw in [0, sum(counts)) located among the segments' `counts` from `start`
// (`ring.locate`: a draw past the total goes to the last segment).
void tfreplay_window_plan(const int64_t* draws, const int64_t* counts, const int64_t* start, int64_t* segment,
                          int64_t* t, int64_t size, int64_t num_steps, int64_t max_length, int64_t num_segments,
                          const int64_t* num_adds, const int32_t* pos, int64_t* rows, int64_t* ids, bool* mask,
                          int64_t* last, int64_t* last_rows) {
  if (draws != nullptr) {
    std::vector<int64_t> ends(num_segments);
    int64_t running = 0;
    for (int64_t s = 0; s < num_segments; ++s) ends[s] = running += counts[s];
    for (int64_t b = 0; b < size; ++b) {
      const int64_t past = std::upper_bound(ends.begin(), ends.end(), draws[b]) - ends.begin();
      const int64_t s = std::min(past, num_segments - 1);
      segment[b] = s;
      t[b] = start[s] + draws[b] - (ends[s] - counts[s]);
    }
  }
  for (int64_t b = 0; b < size; ++b) {
    const int64_t s = segment[b], first = t[b], stored = num_adds[s];
    const int64_t first_slot = FloorMod(first, max_length);  // a slot: an item's place in its segment
    const int64_t first_pos = pos != nullptr ? pos[first_slot * num_segments + s] : 0;
    int64_t real = 0, slot = first_slot;
    for (int64_t k = 0; k < num_steps; ++k) {
      const int64_t row = slot * num_segments + s;
      const bool ok = first + k < stored && (pos == nullptr || int64_t{pos[row]} - first_pos == k);
      rows[k * size + b] = row;
      mask[k * size + b] = ok;
      real += ok ? 1 : 0;
      slot = slot + 1 == max_length ? 0 : slot + 1;
    }
    ids[b] = first * num_segments + s;
    last[b] = real - 1;
    // The last real step's slot: first_slot + real - 1 (real - 1 in [-1, num_steps - 1], num_steps <= max_length).
    int64_t last_slot = first_slot + real - 1;
    last_slot += last_slot < 0 ? max_length : last_slot >= max_length ? -max_length : 0;
    last_rows[b] = last_slot * num_segments + s;
  }
}

// Strict windows through the episode index (`UniformSampler._draw_valid`), up to its random numbers. A window
// is `m` items (`lead`, `history`: the storage's `episodes.Shape`). Per segment: the first candidate start
// (`start`) and how many follow (`counts`, `Shape.draw_range`), and `last`, the newest start drawable (its
// newest id, or with `newest` given, a padded window of `n`: less its `episodes.young_starts`). `*count` gets
// how many valid windows start at most at `last`: from `pos_counts` (`[num_segments, bins]`) with the edge-row
// correction (`Shape.count_from`) when `m - 1 + lead < bins`, else by a scan of every start. Returns
// sum(counts), the range the candidates are drawn from.
int64_t tfreplay_strict_counts(const int64_t* num_adds, int64_t num_segments, int64_t max_length, int64_t lead,
                               int64_t history, int64_t m, int64_t n, const int32_t* pos, const int64_t* pos_counts,
                               int64_t bins, const int32_t* newest, int64_t* start, int64_t* counts, int64_t* last,
                               int64_t* count) {
  const Shape shape{lead, history, m};
  const int64_t need = m - 1 + lead;
  int64_t total = 0, valid = 0;
  for (int64_t s = 0; s < num_segments; ++s) {
    const int64_t num_live = std::min(num_adds[s], max_length), min_id = num_adds[s] - num_live;
    int64_t young = 0;
    if (newest != nullptr && newest[2 * s + 1] == 0) {
      const int64_t p = newest[2 * s];
      const int64_t drawable = p < num_live ? p + 1 - lead : num_live - std::max(history, lead);
      young = std::min(std::max<int64_t>(drawable, 0), n - 1);
    }
    start[s] = min_id + lead;
    counts[s] = std::max<int64_t>(std::max<int64_t>(num_live - m - lead + 1, 0) - young, 0);
    last[s] = num_adds[s] - 1 - young;
    total += counts[s];
    if (need < bins) {  // counted at each window's end row; only the oldest rows can end an invalid one
      for (int64_t b = need; b < bins; ++b) valid += pos_counts[s * bins + b];
      for (int64_t k = 0; k < std::min(history + m - 1, num_live); ++k) {
        const int64_t end_pos = pos[FloorMod(min_id + k, max_length) * num_segments + s];
        valid -= end_pos >= need && !shape.IsValid(min_id + k - (m - 1), end_pos, min_id) ? 1 : 0;
      }
      valid -= young;
    } else {
      for (int64_t k = 0; k + m <= num_live; ++k) {
        const int64_t t = min_id + k;
        const int64_t end_pos = pos[FloorMod(t + m - 1, max_length) * num_segments + s];
        valid += shape.IsValid(t, end_pos, min_id) && t <= last[s] ? 1 : 0;
      }
    }
  }
  *count = valid;
  return total;
}

// One round of candidates: `draws` (`[candidates, size]`, in [0, sum(counts))) located among the segments'
// `counts` from `start` (`ring.locate`); each sample not yet `found` takes its first valid candidate into
// `segment` and `t`. Returns how many are still missing.
int64_t tfreplay_strict_keep(const int64_t* draws, int64_t candidates, int64_t size, const int64_t* start,
                             const int64_t* counts, int64_t num_segments, int64_t max_length, int64_t lead,
                             int64_t history, int64_t m, const int32_t* pos, bool* found, int64_t* segment,
                             int64_t* t) {
  const Shape shape{lead, history, m};
  std::vector<int64_t> ends(num_segments);
  int64_t running = 0, missing = 0;
  for (int64_t s = 0; s < num_segments; ++s) ends[s] = running += counts[s];
  for (int64_t b = 0; b < size; ++b) {
    for (int64_t j = 0; j < candidates && !found[b]; ++j) {
      const int64_t draw = draws[j * size + b];
      const int64_t past = std::upper_bound(ends.begin(), ends.end(), draw) - ends.begin();
      const int64_t s = std::min(past, num_segments - 1);  // a draw past the total goes to the last segment
      const int64_t cand = start[s] + draw - (ends[s] - counts[s]);
      const int64_t end_pos = pos[FloorMod(cand + m - 1, max_length) * num_segments + s];
      if (shape.IsValid(cand, end_pos, start[s] - lead)) {
        found[b] = true;
        segment[b] = s;
        t[b] = cand;
      }
    }
    missing += found[b] ? 0 : 1;
  }
  return missing;
}

// The exact draw of the samples still missing: the `draws[b]`-th valid start (in segment order, then start
// order; at most `last`), or the last row's start past the count (`UniformSampler._draw_valid`'s `exact`).
void tfreplay_strict_exact(const int64_t* draws, int64_t size, const int64_t* num_adds, int64_t num_segments,
                           int64_t max_length, int64_t lead, int64_t history, int64_t m, const int32_t* pos,
                           const int64_t* last, const bool* found, int64_t* segment, int64_t* t) {
  const Shape shape{lead, history, m};
  std::vector<int64_t> valid;  // flat grid places (segment * max_length + k) of the valid starts
  for (int64_t s = 0; s < num_segments; ++s) {
    const int64_t num_live = std::min(num_adds[s], max_length), min_id = num_adds[s] - num_live;
    for (int64_t k = 0; k + m <= num_live; ++k) {
      const int64_t end_pos = pos[FloorMod(min_id + k + m - 1, max_length) * num_segments + s];
      if (shape.IsValid(min_id + k, end_pos, min_id) && min_id + k <= last[s]) valid.push_back(s * max_length + k);
    }
  }
  for (int64_t b = 0; b < size; ++b) {
    if (found[b]) continue;
    const int64_t at = draws[b] >= 0 && draws[b] < static_cast<int64_t>(valid.size()) ? valid[draws[b]]
                                                                                        : num_segments * max_length - 1;
    const int64_t s = at / max_length;
    segment[b] = s;
    t[b] = num_adds[s] - std::min(num_adds[s], max_length) + at % max_length;
  }
}

// The key of the sources this library was built from (tfreplay/native/_sources.py): the loader skips a library
// whose key is not its sources' key, so a build left over from older sources is never used.
#ifndef TFREPLAY_SOURCE_KEY
#define TFREPLAY_SOURCE_KEY ""
#endif
const char* tfreplay_windows_source_key() { return TFREPLAY_SOURCE_KEY; }

}  // extern "C"
