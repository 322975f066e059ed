package fakesite

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)

// at returns t0 plus each offset in milliseconds.
func at(ms ...int) []time.Time {
	ts := make([]time.Time, len(ms))
	for i, m := range ms {
		ts[i] = t0.Add(time.Duration(m) * time.Millisecond)
	}
	return ts
}

func TestPeak(t *testing.T) {
	tests := []struct {
		name     string
		arrivals []time.Time
		window   time.Duration
		want     int
	}{
		{"none", nil, time.Second, 0},
		{"one", at(5), time.Second, 1},
		{"spread out", at(0, 1100, 2200, 3300), time.Second, 1},
		{"closed interval counts both ends", at(0, 1000), time.Second, 2},
		{"just past the window", at(0, 1001), time.Second, 1},
		{"burst in the middle", at(0, 2000, 2100, 2200, 2300, 4000), time.Second, 4},
		{"straddles two fixed windows", at(900, 950, 1000, 1050, 1100), time.Second, 5},
		{"unsorted input", at(2300, 0, 2100, 4000, 2000, 2200), time.Second, 4},
		{"same instant", at(7, 7, 7), 0, 3},
		{"sliding, not fixed", at(0, 500, 999, 1000, 1499, 1500, 2000), time.Second, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, Peak(tt.arrivals, tt.window))
		})
	}
}

func TestPeakLeavesInputAlone(t *testing.T) {
	in := at(300, 100, 200)
	Peak(in, time.Second)
	require.Equal(t, at(300, 100, 200), in)
}

func TestPerTick(t *testing.T) {
	tests := []struct {
		name     string
		arrivals []time.Time
		start    time.Time
		tick     time.Duration
		want     []int
	}{
		{"none", nil, t0, 100 * time.Millisecond, nil},
		{"one per tick", at(0, 100, 200), t0, 100 * time.Millisecond, []int{1, 1, 1}},
		{"tick start is inclusive, end exclusive", at(0, 99, 100), t0, 100 * time.Millisecond, []int{2, 1}},
		{"gaps are zero", at(50, 350), t0, 100 * time.Millisecond, []int{1, 0, 0, 1}},
		{"before start left out", at(-50, 10), t0, 100 * time.Millisecond, []int{1}},
		{"unsorted", at(250, 10, 260), t0, 100 * time.Millisecond, []int{1, 0, 2}},
		{"bad tick", at(0), t0, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, PerTick(tt.arrivals, tt.start, tt.tick))
		})
	}
}
