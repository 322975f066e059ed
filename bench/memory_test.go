package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/fleetgate/fleetgate/throttle"
)

// BenchmarkMemoryAllow compares Throttler.Allow on the default MemoryStore
// (one target) with x/time/rate's Limiter.Allow, from one goroutine and from
// GOMAXPROCS goroutines (b.RunParallel).
//
//	allowed/1ms, allowed/5ms: a limit of 100,000 per window, so every call is
//	    admitted and written to the log; the log holds every admission of the
//	    last window (the 1s window's log is ~100 times longer).
//	refused: 1/1h with the one unit used, so every call is refused.
func BenchmarkMemoryAllow(b *testing.B) {
	ctx := context.Background()
	const host = "hot.bench.test"
	cases := []struct {
		name    string
		rule    string
		want    bool
		limiter func() *rate.Limiter
	}{
		{"allowed/1ms", "100000/1ms", true, func() *rate.Limiter { return rate.NewLimiter(1e11, 1e9) }},
		{"allowed/5ms", "100000/5ms", true, func() *rate.Limiter { return rate.NewLimiter(1e9, 1e9) }},
		{"refused", "1/1h", false, func() *rate.Limiter {
			l := rate.NewLimiter(rate.Every(time.Hour), 1)
			l.Allow()
			return l
		}},
	}
	for _, c := range cases {
		b.Run(c.name+"/fleetgate", func(b *testing.B) {
			thr := newThrottler(b, c.rule)
			if !c.want {
				_, _ = thr.Allow(ctx, host)
			}
			b.ReportAllocs()
			for b.Loop() {
				if d, _ := thr.Allow(ctx, host); d.Allowed != c.want {
					b.Fatalf("Allowed=%v, want %v", d.Allowed, c.want)
				}
			}
		})
		b.Run(c.name+"/x-time-rate", func(b *testing.B) {
			l := c.limiter()
			b.ReportAllocs()
			for b.Loop() {
				if l.Allow() != c.want {
					b.Fatalf("Allow=%v, want %v", !c.want, c.want)
				}
			}
		})
		b.Run(c.name+"/parallel/fleetgate", func(b *testing.B) {
			thr := newThrottler(b, c.rule)
			if !c.want {
				_, _ = thr.Allow(ctx, host)
			}
			var wrong atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				n := int64(0)
				for pb.Next() {
					if d, _ := thr.Allow(ctx, host); d.Allowed != c.want {
						n++
					}
				}
				wrong.Add(n)
			})
			// Counted, not fatal: see "wrong decisions" in BENCHMARKS.md.
			b.ReportMetric(float64(wrong.Load())/float64(b.N), "wrong/op")
		})
		b.Run(c.name+"/parallel/x-time-rate", func(b *testing.B) {
			l := c.limiter()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if l.Allow() != c.want {
						b.Errorf("Allow=%v, want %v", !c.want, c.want)
						return
					}
				}
			})
		})
	}
}

// BenchmarkMemoryRestore restores into an empty MemoryStore one request of
// n units (units/n), as a Throttler seeds its local log with its whole share
// when it falls back from a failed store, or n requests of one unit
// (requests/n), as a replay of placeholders: the cost must grow with n, not
// n² (100,000 units took 8 s one at a time, with the target's lock held).
func BenchmarkMemoryRestore(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{1_000, 10_000, 100_000} {
		for _, shape := range []string{"units", "requests"} {
			entries := []throttle.Entry{{ID: 1, N: n, Age: -time.Second}}
			if shape == "requests" {
				entries = make([]throttle.Entry, n)
				for i := range entries {
					entries[i] = throttle.Entry{ID: uint64(i + 1), N: 1, Age: -time.Second}
				}
			}
			b.Run(fmt.Sprintf("%s/%d", shape, n), func(b *testing.B) {
				for b.Loop() {
					s := throttle.NewMemoryStore()
					if err := s.Restore(ctx, "restore.bench.test", time.Minute, entries); err != nil {
						b.Fatal(err)
					}
					s.Close()
				}
			})
		}
	}
}
