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
	for _, sc := range decisionScenarios {
		p := setupPair(b, srv, sc)
		for _, g := range []int{1, 8, 64} {
			runFG := func() {
				b.Run(fmt.Sprintf("%s/g=%d/fleetgate", sc.name, g), func(b *testing.B) {
					stats.reset(b)
					defer stats.report(b)
					runGoroutines(b, g, p.fleetgate)
					p.warn.check(b)
					if p.want {
						checkWritten(b, stats.c, p.fgPrefix+"{"+lastTarget(b, p.hs)+"}:log")
					}
				})
			}
			runRL := func() {
				b.Run(fmt.Sprintf("%s/g=%d/redis_rate", sc.name, g), func(b *testing.B) {
					stats.reset(b)
					defer stats.report(b)
					runGoroutines(b, g, p.redisRate)
					if p.want { // every call admitted must have been written
						checkWritten(b, stats.c, "rate:"+p.rlPrefix+lastTarget(b, p.hs)) // redis_rate's own prefix first
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

// pairRound is how many decisions BenchmarkPairedDecisions makes with one
// library before it turns to the other.
const pairRound = 100

// BenchmarkPairedDecisions compares the two libraries at one goroutine, on
// the scenarios of BenchmarkRedisDecisions, with the libraries taking turns
// in rounds of pairRound decisions: a change in the machine's speed while it
// runs (the neighbours of a shared VM) then weighs on both alike, where
// BenchmarkRedisDecisions, one library for a second and then the other,
// moved the ratio at one goroutine by ±20% from run to run on the same
// build. Which library goes first alternates from round to round. An op is
// one decision of each; it reports each library's decisions per second
// (fleetgate-ops/s, redis_rate-ops/s) and the ratio of fleetgate's to
// redis_rate's.
func BenchmarkPairedDecisions(b *testing.B) {
	srv := startRedis(b)
	for _, sc := range decisionScenarios {
		p := setupPair(b, srv, sc)
		b.Run(sc.name, func(b *testing.B) {
			var fgTime, rlTime time.Duration
			// turn makes the decisions from i to i+n-1 with op and returns
			// how long they took.
			turn := func(op func(int) error, i, n int) time.Duration {
				start := time.Now()
				for j := i; j < i+n; j++ {
					if err := op(j); err != nil {
						b.Fatal(err)
					}
				}
				return time.Since(start)
			}
			b.ResetTimer()
			for i, round := 0, 0; i < b.N; i, round = i+pairRound, round+1 {
				n := min(pairRound, b.N-i)
				if round%2 == 0 {
					fgTime += turn(p.fleetgate, i, n)
					rlTime += turn(p.redisRate, i, n)
				} else {
					rlTime += turn(p.redisRate, i, n)
					fgTime += turn(p.fleetgate, i, n)
				}
			}
			b.StopTimer()
			p.warn.check(b)
			b.ReportMetric(float64(b.N)/fgTime.Seconds(), "fleetgate-ops/s")
			b.ReportMetric(float64(b.N)/rlTime.Seconds(), "redis_rate-ops/s")
			b.ReportMetric(rlTime.Seconds()/fgTime.Seconds(), "ratio")
		})
	}
}

// decisionPair is a scenario's two libraries on one server, each with its
// own keys, and their decisions.
type decisionPair struct {
	hs                 []string // the targets, in the order decisions go round them
	want               bool     // every decision admits
	fg                 *throttle.Throttler
	warn               *warnCounter
	rl                 *redis_rate.Limiter
	rlim               redis_rate.Limit
	fgPrefix, rlPrefix string
}

// setupPair sets up sc's libraries on srv, every window filled when sc
// refuses.
func setupPair(b *testing.B, srv *redisServer, sc decisionScenario) *decisionPair {
	b.Helper()
	p := &decisionPair{hs: hosts(sc.targets), want: !sc.refused, fgPrefix: keyPrefix(), rlPrefix: keyPrefix()}
	if sc.targets == 1 {
		p.hs = []string{"hot.bench.test"}
	}
	p.fg, p.warn = redisThrottler(b, srv.client(b), p.fgPrefix, sc.rule())
	p.rl, p.rlim = redis_rate.NewLimiter(srv.client(b)), sc.rateLimit()
	if sc.refused { // fill every window
		ctx, n := context.Background(), len(p.hs)*refusedLimit
		if err := parallelFill(8, n, func(i int) error {
			_, err := p.fg.Allow(ctx, p.hs[i%len(p.hs)])
			return err
		}); err != nil {
			b.Fatal(err)
		}
		if err := parallelFill(8, n, func(i int) error {
			_, err := p.rl.Allow(ctx, p.rlPrefix+p.hs[i%len(p.hs)], p.rlim)
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	return p
}

// fleetgate makes decision i with fleetgate and checks it.
func (p *decisionPair) fleetgate(i int) error {
	d, err := p.fg.Allow(context.Background(), p.hs[i%len(p.hs)])
	if err != nil {
		return err
	}
	if d.Allowed != p.want {
		return fmt.Errorf("fleetgate: Allowed=%v, want %v", d.Allowed, p.want)
	}
	return nil
}

// redisRate makes decision i with redis_rate and checks it.
func (p *decisionPair) redisRate(i int) error {
	r, err := p.rl.Allow(context.Background(), p.rlPrefix+p.hs[i%len(p.hs)], p.rlim)
	if err != nil {
		return err
	}
	if (r.Allowed > 0) != p.want {
		return fmt.Errorf("redis_rate: Allowed=%d, want %v", r.Allowed, p.want)
	}
	return nil
}

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
