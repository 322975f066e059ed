package main

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/internal/fakesite"
)

// paced returns n arrivals every gap from base.
func paced(base time.Time, n int, gap time.Duration) []time.Time {
	ts := make([]time.Time, n)
	for i := range ts {
		ts[i] = base.Add(time.Duration(i) * gap)
	}
	return ts
}

// TestTableRateNeverExceedsTheLimit feeds the recorder arrival times (no
// sleeps) and reads the rate off the table: runs that kept the limit of 20
// in any 1s never show more than 20.0/s.
func TestTableRateNeverExceedsTheLimit(t *testing.T) {
	base := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	bursts := append(paced(base, 20, 0), paced(base.Add(1050*time.Millisecond), 20, 0)...)
	tests := []struct {
		name     string
		arrivals []time.Time
		want     string
	}{
		{"-pages 20, paced 50ms apart in one window", paced(base, 20, 50*time.Millisecond), " 20.0/s (20.0/s) "},
		{"-pages 5 in one window", paced(base, 5, 50*time.Millisecond), " 5.0/s (20.0/s) "},
		{"two bursts of 20, 1.05s apart", bursts, " 20.0/s (20.0/s) "},
		{"300 at 20 per 1.05s", paced(base, 300, 52500*time.Microsecond), " 19.1/s (20.0/s) "},
		{"none", nil, " 0.0/s (20.0/s) "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.LessOrEqual(t, fakesite.Peak(tt.arrivals, demoWindow), demoLimit, "the run kept the limit")
			rec := &recorder{}
			for _, at := range tt.arrivals {
				rec.wrote(at)
				rec.answered(200)
			}
			rep, _, _ := rec.report("127.0.0.1", span(tt.arrivals))
			var out bytes.Buffer
			require.NoError(t, writeTable(&out, []siteReport{rep}))
			require.Contains(t, out.String(), tt.want)
		})
	}
}

// TestAchievedRateIsBoundedByThePeak: over random runs, the rate is never
// more than the peak per window, so never more than the limit for a run
// that kept it.
func TestAchievedRateIsBoundedByThePeak(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	base := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 500 {
		// Candidate times, admitted by a sliding window of 20 in any
		// closed 1s: what a run that kept the limit sends.
		var kept []time.Time
		at := base
		for range rng.IntN(200) {
			at = at.Add(time.Duration(rng.Int64N(int64(120 * time.Millisecond))))
			if n := len(kept); n < demoLimit || at.Sub(kept[n-demoLimit]) > demoWindow {
				kept = append(kept, at)
			}
		}
		peak := fakesite.Peak(kept, demoWindow)
		require.LessOrEqual(t, peak, demoLimit, "run %d", i)
		end := at.Add(time.Duration(rng.Int64N(int64(2 * time.Second))))
		shuffled := slices.Clone(kept)
		rng.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
		for _, e := range []time.Time{end, lastOf(kept)} {
			got := achievedRate(shuffled, demoWindow, e)
			require.LessOrEqual(t, got, float64(peak)/demoWindow.Seconds()+1e-9, "run %d: %d arrivals", i, len(kept))
		}
	}
}

func lastOf(ts []time.Time) time.Time {
	if len(ts) == 0 {
		return time.Time{}
	}
	return ts[len(ts)-1]
}

// TestAchievedRateCountsWholeWindows: exact figures at the edges. Windows
// are half-open, so an arrival exactly a window after the first falls in
// the next; arrivals after end, or in the last unfinished window, are left
// out; the order of arrivals does not matter.
func TestAchievedRateCountsWholeWindows(t *testing.T) {
	base := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms ...int) []time.Time {
		var ts []time.Time
		for _, m := range ms {
			ts = append(ts, base.Add(time.Duration(m)*time.Millisecond))
		}
		return ts
	}
	for _, tc := range []struct {
		name     string
		arrivals []time.Time
		end      time.Time
		want     float64
	}{
		{"one at the window's end goes to the next", at(0, 500, 1000), base.Add(time.Second), 2},
		{"the unfinished window is left out", at(0, 500, 1000, 1500), base.Add(1900 * time.Millisecond), 2},
		{"shorter than a window: per one window, up to end", at(0, 100, 300), base.Add(200 * time.Millisecond), 2},
		{"end before the first", at(0, 100), base.Add(-2 * time.Second), 0},
		{"any order", at(1500, 0, 500, 2200), base.Add(2200 * time.Millisecond), 1.5},
		{"none", nil, base, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.InDelta(t, tc.want, achievedRate(tc.arrivals, time.Second, tc.end), 1e-9)
		})
	}
}
