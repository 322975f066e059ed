package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/throttle"
)

// fillOne admits n single units to host through thr (Allow over g
// goroutines) until n were admitted; the rule's limit must be n, so the log
// is then exactly full. A refusal whose own Decision says units remain is a
// wrong decision and is logged.
func fillOne(tb testing.TB, thr *throttle.Throttler, host string, n, g int) {
	tb.Helper()
	ctx := context.Background()
	var admitted, refused atomic.Int64
	if err := parallelFill(g, math.MaxInt, func(int) error {
		if admitted.Load() >= int64(n) {
			return errFilled
		}
		d, err := thr.Allow(ctx, host)
		switch {
		case err != nil:
			return err
		case d.Allowed:
			admitted.Add(1)
		case d.Remaining > 0:
			refused.Add(1)
		}
		return nil
	}); err != nil && !errors.Is(err, errFilled) {
		tb.Fatal(err)
	}
	if r := refused.Load(); r > 0 {
		tb.Logf("filling %d entries: %d refusals that reported units remaining", n, r)
	}
}

var errFilled = errors.New("filled")

// BenchmarkRedisMemoryPerTarget fills one target's log with N single-unit
// admissions (Allow, margin 0, a 1h window) and reports what Redis says the
// target's keys take (MEMORY USAGE ... SAMPLES 0): log-B (the list, absent
// while the log is inline), meta-B (the pause key, with an inline log),
// procs-B, B/target (their sum) and B/entry (log and meta divided by N).
// ns/op is the MEMORY USAGE call itself, of no interest.
func BenchmarkRedisMemoryPerTarget(b *testing.B) {
	srv := startRedis(b)
	c := srv.client(b)
	ctx := context.Background()
	for _, n := range []int{10, 100, 10_000} {
		b.Run("N="+strconv.Itoa(n), func(b *testing.B) {
			prefix := keyPrefix()
			thr, warn := redisThrottler(b, c, prefix, strconv.Itoa(n)+"/1h")
			const host = "hot.bench.test"
			fillOne(b, thr, host, n, 8)
			warn.check(b)
			tag := prefix + "{" + host + "}:"
			card := c.LLen(ctx, tag+"log").Val()
			if meta := c.Get(ctx, tag+"pause").Val(); card == 0 && len(meta) >= 48 {
				card = int64(binary.BigEndian.Uint64([]byte(meta[40:48]))) // inline
			}
			if card != int64(n) {
				b.Fatalf("log holds %d entries, want %d", card, n)
			}
			var logB, metaB, procsB int64
			b.ReportAllocs()
			for b.Loop() {
				logB = c.MemoryUsage(ctx, tag+"log", 0).Val() // 0: no list
				metaB = c.MemoryUsage(ctx, tag+"pause", 0).Val()
				procsB = c.MemoryUsage(ctx, tag+"procs", 0).Val()
			}
			b.ReportMetric(float64(logB), "log-B")
			b.ReportMetric(float64(metaB), "meta-B")
			b.ReportMetric(float64(procsB), "procs-B")
			b.ReportMetric(float64(logB+metaB+procsB), "B/target")
			b.ReportMetric(float64(logB+metaB)/float64(n), "B/entry")
		})
	}
}

// BenchmarkProcessMemoryPerTarget reports the Go heap a process keeps per
// target (B/target): a Throttler on a MemoryStore with N entries in each
// target's log, and a Throttler on a RedisStore (its own per-target state
// only; the log is in Redis). heapAlloc after GC, divided by the targets.
func BenchmarkProcessMemoryPerTarget(b *testing.B) {
	srv := startRedis(b)
	ctx := context.Background()
	cases := []struct {
		name           string
		redis          bool
		targets, units int
	}{
		{"memory/targets=100000/N=1", false, 100_000, 1},
		{"memory/targets=100/N=100", false, 100, 100},
		{"memory/targets=100/N=10000", false, 100, 10_000},
		{"redis/targets=100000/N=1", true, 100_000, 1},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var perTarget float64
			for b.Loop() {
				hs := hosts(c.targets)
				before := heapAlloc()
				var thr *throttle.Throttler
				if c.redis {
					thr, _ = redisThrottler(b, srv.client(b), keyPrefix(), strconv.Itoa(c.units)+"/1h")
				} else {
					thr = newThrottler(b, strconv.Itoa(c.units)+"/1h")
				}
				if err := parallelFill(8, c.targets*c.units, func(i int) error {
					_, err := thr.Allow(ctx, hs[i%len(hs)])
					return err
				}); err != nil {
					b.Fatal(err)
				}
				after := heapAlloc()
				perTarget = float64(after-before) / float64(c.targets)
				runtime.KeepAlive(hs)
				runtime.KeepAlive(thr)
				_ = thr.Close()
			}
			b.ReportMetric(perTarget, "B/target")
			if c.units > 1 {
				b.ReportMetric(perTarget/float64(c.units), "B/entry")
			}
		})
	}
}

func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkLogSize measures one decision on a full log of N entries (limit
// N per 1h, margin 0, filled with N Allows): Allow, which refuses, and
// ReserveN+Cancel, which books the slot a window after the oldest entry and
// releases it (so the log stays at N). Redis and memory store, 1 goroutine.
// For Redis, server-µs/op is the server's time inside scripts per call
// (reserve+cancel makes two calls per op).
func BenchmarkLogSize(b *testing.B) {
	srv := startRedis(b)
	stats := &serverStats{c: srv.client(b)}
	ctx := context.Background()
	const host = "hot.bench.test"
	for _, store := range []string{"redis", "memory"} {
		for _, n := range []int{10, 1_000, 100_000} {
			rule := strconv.Itoa(n) + "/1h"
			var thr *throttle.Throttler
			var warn *warnCounter
			if store == "redis" {
				thr, warn = redisThrottler(b, srv.client(b), keyPrefix(), rule)
			} else {
				thr = newThrottler(b, rule)
			}
			fillOne(b, thr, host, n, 8)
			b.Run(fmt.Sprintf("%s/N=%d/allow", store, n), func(b *testing.B) {
				if store == "redis" {
					stats.reset(b)
					defer stats.report(b)
				}
				runGoroutines(b, 1, func(int) error {
					d, err := thr.Allow(ctx, host)
					if err == nil && d.Allowed {
						err = fmt.Errorf("admitted on a full log")
					}
					return err
				})
			})
			b.Run(fmt.Sprintf("%s/N=%d/reserve+cancel", store, n), func(b *testing.B) {
				if store == "redis" {
					stats.reset(b)
					defer stats.report(b)
				}
				runGoroutines(b, 1, func(int) error {
					r, err := thr.ReserveN(ctx, host, 1)
					if err != nil {
						return err
					}
					if r.Delay() <= 0 {
						return fmt.Errorf("a slot now on a full log")
					}
					return r.Cancel(ctx)
				})
			})
			if warn != nil {
				warn.check(b)
			}
		}
	}
}

// BenchmarkTargets measures Allow round-robin over T pre-populated targets,
// 1 goroutine, Redis and memory store. refused: every target holds one
// entry of a 1/1h limit, so the state never changes. allowed: the same keys
// under a 100000/10ms limit (the most a rule allows), so each call adds an
// entry to its target's log. The memory store also runs 200,000 targets,
// past the Throttler's 100,000-host cache.
func BenchmarkTargets(b *testing.B) {
	srv := startRedis(b)
	stats := &serverStats{c: srv.client(b)}
	ctx := context.Background()
	for _, store := range []string{"redis", "memory"} {
		counts := []int{1, 1_000, 100_000}
		if store == "memory" {
			counts = append(counts, 200_000)
		}
		for _, t := range counts {
			hs := hosts(t)
			var refusing, admitting *throttle.Throttler
			var warns []*warnCounter
			if store == "redis" {
				c, prefix := srv.client(b), keyPrefix()
				var w1, w2 *warnCounter
				refusing, w1 = redisThrottler(b, c, prefix, "1/1h")
				admitting, w2 = redisThrottler(b, c, prefix, "100000/10ms")
				warns = append(warns, w1, w2)
			} else {
				ms := throttle.NewMemoryStore()
				b.Cleanup(func() { _ = ms.Close() })
				refusing = newThrottler(b, "1/1h", throttle.WithStore(ms))
				admitting = newThrottler(b, "100000/10ms", throttle.WithStore(ms))
			}
			if err := parallelFill(8, t, func(i int) error {
				_, err := refusing.Allow(ctx, hs[i])
				return err
			}); err != nil {
				b.Fatal(err)
			}
			for _, h := range hs[:min(t, 100_000)] { // warm admitting's host cache
				if _, _, err := admitting.Target(ctx, h); err != nil {
					b.Fatal(err)
				}
			}
			b.Run(fmt.Sprintf("%s/targets=%d/refused", store, t), func(b *testing.B) {
				if store == "redis" {
					stats.reset(b)
					defer stats.report(b)
				}
				runGoroutines(b, 1, func(i int) error {
					d, err := refusing.Allow(ctx, hs[i%t])
					if err == nil && d.Allowed {
						err = fmt.Errorf("admitted past a 1/1h limit")
					}
					return err
				})
			})
			b.Run(fmt.Sprintf("%s/targets=%d/allowed", store, t), func(b *testing.B) {
				if store == "redis" {
					stats.reset(b)
					defer stats.report(b)
				}
				runGoroutines(b, 1, func(i int) error {
					d, err := admitting.Allow(ctx, hs[i%t])
					if err == nil && !d.Allowed {
						err = fmt.Errorf("refused under a 100000/10ms limit")
					}
					return err
				})
			})
			for _, w := range warns {
				w.check(b)
			}
		}
	}
}

// BenchmarkManyUnits measures store calls that carry many units on Redis,
// through the RedisStore itself: a Reserve of n units (granted at once), the
// Cancel of such a booking, and a Restore of n one-unit placeholders, as a
// Throttler replays the other processes' shares when it leaves its
// fallback. The store writes or removes one log entry per unit, so a call's
// time grows with n; the Throttler gives such calls more than its store
// timeout (20 µs a unit past the first). Each op uses a target of its own.
func BenchmarkManyUnits(b *testing.B) {
	srv := startRedis(b)
	client := srv.client(b)
	prefix := keyPrefix()
	store, err := throttle.NewRedisStore(client, throttle.WithKeyPrefix(prefix))
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	ageData(b, client, prefix)
	ctx := context.Background()
	lim := throttle.Limit{Limit: 100_000, Window: time.Minute}
	var targets atomic.Int64
	reserve := func(b *testing.B, n int) string {
		target := fmt.Sprintf("units-%d.bench.test", targets.Add(1))
		grants := make([]throttle.Grant, 1)
		if _, err := store.Reserve(ctx, target, lim, []throttle.Request{{ID: 1, N: n, MaxWait: -1}}, grants); err != nil {
			b.Fatal(err)
		}
		if !grants[0].OK || grants[0].Delay > time.Second {
			b.Fatalf("reserve %d units on an empty log: %+v", n, grants[0])
		}
		return target
	}
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("reserve/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				reserve(b, n)
			}
		})
		b.Run(fmt.Sprintf("cancel/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				target := reserve(b, n)
				b.StartTimer()
				if err := store.Cancel(ctx, target, 1, n); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("restore/n=%d", n), func(b *testing.B) {
			entries := make([]throttle.Entry, n)
			for i := range entries {
				entries[i] = throttle.Entry{ID: throttle.SharedEntry | uint64(i+1), N: 1, Age: -time.Second}
			}
			for b.Loop() {
				target := fmt.Sprintf("units-%d.bench.test", targets.Add(1))
				if err := store.Restore(ctx, target, time.Minute, entries); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
