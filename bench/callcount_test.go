package bench

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/throttle"
)

// Contention experiment: processes (each a Throttler with its own go-redis
// client and RedisStore) × goroutines calling Wait in a loop on one target
// limited to 200/1s. The first window's 200 admissions are immediate; the
// next 600 come at the rule's pace, so one run takes ~3s.
const (
	contLimit      = 200
	contWindow     = time.Second
	contAdmissions = 800
)

// contention is one shape of the experiment.
type contention struct {
	name       string
	procs      int // Throttlers, each with its own client and RedisStore
	goroutines int // per Throttler
	margin     time.Duration
}

var contentions = []contention{
	// The brief's shape: waiters of one process share store calls.
	{"procs=3/g=8/margin=0", 3, 8, 0},
	// No sharing possible: every waiter is a process of its own.
	{"procs=24/g=1/margin=0", 24, 1, 0},
	// The default margin: max-in-window should then stay at the limit.
	{"procs=3/g=8/margin=50ms", 3, 8, throttle.DefaultMargin},
}

// BenchmarkWaitContention counts store calls (EVALSHA/EVAL, through a hook on
// every client) per admission by Wait under contention. One op is one whole
// run of the experiment; read the custom metrics:
//
//	calls/admit         over the whole run
//	steady-calls/admit  after the first window filled (the contended part)
//	admits/s            after the first window filled (the rule allows 200)
//	max-in-window       most admissions seen in any 1s interval, by the
//	                    goroutines' clocks as Wait returned (the rule's 200,
//	                    plus wake-up jitter: margin 0 leaves no room for it)
func BenchmarkWaitContention(b *testing.B) {
	srv := startRedis(b)
	for _, c := range contentions {
		b.Run(c.name, func(b *testing.B) { benchContention(b, srv, c) })
	}
}

func benchContention(b *testing.B, srv *redisServer, c contention) {
	b.ReportAllocs()
	var calls, admits, steadyCalls, steadyAdmits, steadySecs float64
	maxIn := 0
	for range b.N {
		r := runContention(b, srv, c)
		calls += float64(r.calls)
		admits += float64(r.admits)
		steadyCalls += float64(r.calls - r.callsAtFull)
		steadyAdmits += float64(r.admits - contLimit)
		steadySecs += r.steady.Seconds()
		maxIn = max(maxIn, r.maxInWindow)
	}
	b.ReportMetric(calls/admits, "calls/admit")
	b.ReportMetric(steadyCalls/steadyAdmits, "steady-calls/admit")
	b.ReportMetric(steadyAdmits/steadySecs, "admits/s")
	b.ReportMetric(float64(maxIn), "max-in-window")
}

type contentionResult struct {
	calls, callsAtFull int64
	admits             int
	steady             time.Duration
	maxInWindow        int
}

func runContention(b *testing.B, srv *redisServer, c contention) contentionResult {
	b.Helper()
	rule := throttle.Rule{Limit: contLimit, Window: contWindow}.String()
	prefix := keyPrefix()
	var counter scriptCounter
	var warns []*warnCounter
	var thrs []*throttle.Throttler
	for range c.procs {
		thr, w := redisThrottler(b, srv.client(b, counter.hook()), prefix, rule, throttle.WithMargin(c.margin))
		thrs, warns = append(thrs, thr), append(warns, w)
	}
	var (
		mu          sync.Mutex
		times       []time.Time
		callsAtFull atomic.Int64
		fullAt      time.Time
		taken       atomic.Int64 // admissions handed out, to stop at contAdmissions
		wg          sync.WaitGroup
		errs        = make(chan error, c.procs*c.goroutines)
	)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, thr := range thrs {
		for range c.goroutines {
			wg.Go(func() {
				for taken.Add(1) <= contAdmissions {
					if err := thr.Wait(ctx, "hot.bench.test"); err != nil {
						errs <- err
						return
					}
					now := time.Now()
					mu.Lock()
					times = append(times, now)
					if len(times) == contLimit {
						callsAtFull.Store(counter.scripts.Load())
						fullAt = now
					}
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	end := time.Now()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	for _, w := range warns {
		w.check(b)
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	maxIn, lo := 0, 0
	for hi := range times {
		for times[hi].Sub(times[lo]) >= contWindow {
			lo++
		}
		maxIn = max(maxIn, hi-lo+1)
	}
	return contentionResult{
		calls:       counter.scripts.Load(),
		callsAtFull: callsAtFull.Load(),
		admits:      len(times),
		steady:      end.Sub(fullAt),
		maxInWindow: maxIn,
	}
}
