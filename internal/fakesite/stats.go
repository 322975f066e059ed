package fakesite

import (
	"slices"
	"time"
)

// Peak returns the largest number of arrivals in any closed interval of
// length window: arrivals a <= b with b-a <= window count together. The
// arrivals need not be sorted and are not modified. A window that is not
// positive counts arrivals at the same instant.
func Peak(arrivals []time.Time, window time.Duration) int {
	ts := slices.Clone(arrivals)
	slices.SortFunc(ts, time.Time.Compare)
	peak, i := 0, 0
	for j := range ts {
		for ts[j].Sub(ts[i]) > window {
			i++
		}
		peak = max(peak, j-i+1)
	}
	return peak
}

// PerTick returns how many arrivals fall in each tick after start: element
// k counts arrivals in [start+k*tick, start+(k+1)*tick). It ends with the
// tick of the latest arrival; arrivals before start are left out. A tick that
// is not positive returns nil.
func PerTick(arrivals []time.Time, start time.Time, tick time.Duration) []int {
	if tick <= 0 {
		return nil
	}
	var counts []int
	for _, a := range arrivals {
		if a.Before(start) {
			continue
		}
		k := int(a.Sub(start) / tick)
		if k >= len(counts) {
			counts = append(counts, make([]int, k+1-len(counts))...)
		}
		counts[k]++
	}
	return counts
}
