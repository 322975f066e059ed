package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/throttle"
)

// decisionScenario is one shape of load for BenchmarkRedisDecisions.
type decisionScenario struct {
	name    string
	targets int  // round-robin over this many targets
	refused bool // every window is full: each decision refuses
}

var decisionScenarios = []decisionScenario{
	{"hot/allowed", 1, false},
	{"hot/refused", 1, true},
	{"many/allowed", 1000, false},
	{"many/refused", 1000, true},
}

// Limits of the scenarios. Allowed: so high that everything is admitted and
// both libraries write on every call. Refused: a small limit per hour, filled
// before the run, so every call is a refusal.
const (
	allowedRule   = "100000/100ms"
	allowedLimit  = 100000
	allowedWindow = 100 * time.Millisecond
	refusedLimit  = 10
	refusedRule   = "10/1h"
)

// BenchmarkRedisDecisions compares non-blocking decisions on one local
// Redis: fleetgate's Throttler.Allow on a RedisStore against
// redis_rate.Limiter.Allow with the same limit, at exactly 1, 8 and 64
// goroutines, each pair run back to back.
func BenchmarkRedisDecisions(b *testing.B) {
	// Which library of a pair runs first alternates from one run of the
	// benchmark (-count) to the next, so that neither always gets the
	// state the other leaves behind.
	redisFirst := decisionRuns%2 == 1
	decisionRuns++
	srv := startRedis(b)
	stats := &serverStats{c: srv.client(b)}
	ctx := context.Background()
	for _, sc := range decisionScenarios {
		hs := hosts(sc.targets)
		if sc.targets == 1 {
			hs = []string{"hot.bench.test"}
		}
		fgPrefix := keyPrefix()
		fg, warn := redisThrottler(b, srv.client(b), fgPrefix, sc.rule())
		rl, rlim := redis_rate.NewLimiter(srv.client(b)), sc.rateLimit()
		rlPrefix := keyPrefix()
		if sc.refused { // fill every window
			if err := parallelFill(8, len(hs)*refusedLimit, func(i int) error {
				_, err := fg.Allow(ctx, hs[i%len(hs)])
				return err
			}); err != nil {
				b.Fatal(err)
			}
			if err := parallelFill(8, len(hs)*refusedLimit, func(i int) error {
				_, err := rl.Allow(ctx, rlPrefix+hs[i%len(hs)], rlim)
				return err
			}); err != nil {
				b.Fatal(err)
			}
		}
		want := !sc.refused
		for _, g := range []int{1, 8, 64} {
			runFG := func() {
				b.Run(fmt.Sprintf("%s/g=%d/fleetgate", sc.name, g), func(b *testing.B) {
					stats.reset(b)
					defer stats.report(b)
					runGoroutines(b, g, func(i int) error {
						d, err := fg.Allow(ctx, hs[i%len(hs)])
						if err != nil {
							return err
						}
						if d.Allowed != want {
							return fmt.Errorf("fleetgate: Allowed=%v, want %v", d.Allowed, want)
						}
						return nil
					})
					warn.check(b)
					if want {
						checkWritten(b, stats.c, fgPrefix+"{"+lastTarget(b, hs)+"}:log")
					}
				})
			}
			runRL := func() {
				b.Run(fmt.Sprintf("%s/g=%d/redis_rate", sc.name, g), func(b *testing.B) {
					stats.reset(b)
					defer stats.report(b)
					runGoroutines(b, g, func(i int) error {
						r, err := rl.Allow(ctx, rlPrefix+hs[i%len(hs)], rlim)
						if err != nil {
							return err
						}
						if (r.Allowed > 0) != want {
							return fmt.Errorf("redis_rate: Allowed=%d, want %v", r.Allowed, want)
						}
						return nil
					})
					if want { // every call admitted must have been written
						checkWritten(b, stats.c, "rate:"+rlPrefix+lastTarget(b, hs)) // redis_rate's own prefix first
					}
				})
			}
			if redisFirst {
				runRL()
				runFG()
			} else {
				runFG()
				runRL()
			}
		}
	}
}

// decisionRuns counts the runs of BenchmarkRedisDecisions in this process.
var decisionRuns int

// lastTarget is the target of a run's last decision: its key has not
// expired yet, where the first target's may have, a window after its
// latest call.
func lastTarget(b *testing.B, hs []string) string { return hs[(b.N-1)%len(hs)] }

// checkWritten fails b unless key exists: a scenario that admits must
// compare writes with writes.
func checkWritten(b *testing.B, c *redis.Client, key string) {
	b.Helper()
	ctx := context.Background()
	n, err := c.Exists(ctx, key).Result()
	if err != nil {
		b.Fatal(err)
	}
	// A short log is inline, in the target's pause key, after its 48
	// bytes of numbers.
	meta := strings.TrimSuffix(key, ":log") + ":pause"
	inline, err := c.StrLen(ctx, meta).Result()
	if err != nil {
		b.Fatal(err)
	}
	if n != 1 && inline <= 48 {
		b.Fatalf("%s does not exist, nor an inline log in %s, after calls that were all admitted: the library wrote nothing", key, meta)
	}
}

func (sc decisionScenario) rule() string {
	if sc.refused {
		return refusedRule
	}
	return allowedRule
}

func (sc decisionScenario) rateLimit() redis_rate.Limit {
	if sc.refused {
		return redis_rate.Limit{Rate: refusedLimit, Burst: refusedLimit, Period: time.Hour}
	}
	// The same limit as allowedRule. A far higher rate would make
	// redis_rate write nothing: its emission interval would fall below the
	// float precision of its clock, so that the new TAT equals now and the
	// script skips its SET, as PerSecond(1e9) did here before (BENCHMARKS.md).
	// The benchmark checks that it writes.
	return redis_rate.Limit{Rate: allowedLimit, Burst: allowedLimit, Period: allowedWindow}
}

// redisThrottler returns a Throttler with a RedisStore on client, the default
// rule "*=rule", no margin (so its window is exactly the rule's, like
// redis_rate's) and a logger that counts fallbacks.
func redisThrottler(tb testing.TB, client redis.UniversalClient, prefix, rule string, opts ...throttle.Option) (*throttle.Throttler, *warnCounter) {
	tb.Helper()
	store, err := throttle.NewRedisStore(client, throttle.WithKeyPrefix(prefix))
	if err != nil {
		tb.Fatal(err)
	}
	ageData(tb, client, prefix)
	warn := &warnCounter{}
	thr := newThrottler(tb, rule, append([]throttle.Option{throttle.WithStore(store), throttle.WithLogger(slog.New(warn))}, opts...)...)
	return thr, warn
}

// ageData makes the data of the store at prefix on client (a single node)
// a day old, as if it had long been in use, so that no target found empty
// is held for a young store's sake (a store's first use holds each target
// for two windows). The epoch key and its value, the epoch and when the
// key expires (8-byte big-endian microseconds each), are
// lua/sliding_log.lua's.
func ageData(tb testing.TB, client redis.UniversalClient, prefix string) {
	tb.Helper()
	ctx := context.Background()
	now, err := client.Time(ctx).Result()
	if err != nil {
		tb.Fatal(err)
	}
	v := binary.BigEndian.AppendUint64(nil, uint64(now.Add(-24*time.Hour).UnixMicro()))
	v = binary.BigEndian.AppendUint64(v, uint64(now.Add(24*time.Hour).UnixMicro()))
	if err := client.Set(ctx, prefix+"epoch", v, 24*time.Hour).Err(); err != nil {
		tb.Fatal(err)
	}
}

// newThrottler returns a Throttler with the default rule "*=rule" and no
// margin, closed when tb ends.
func newThrottler(tb testing.TB, rule string, opts ...throttle.Option) *throttle.Throttler {
	tb.Helper()
	rules, err := throttle.ParseRules("*=" + rule)
	if err != nil {
		tb.Fatal(err)
	}
	thr, err := throttle.New(rules, append([]throttle.Option{throttle.WithMargin(0)}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = thr.Close() })
	return thr
}
