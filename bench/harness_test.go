package bench

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// runGoroutines calls op b.N times in all, spread over exactly g goroutines
// (unlike b.RunParallel, whose count is a multiple of GOMAXPROCS), and
// reports the throughput as ops/s besides ns/op. i is the call's index, from
// 0 to b.N-1. The first error stops the run and fails b.
func runGoroutines(b *testing.B, g int, op func(i int) error) {
	b.Helper()
	b.ReportAllocs()
	var (
		next    atomic.Int64
		stopped atomic.Bool
		errOnce sync.Once
		firstEr error
		wg      sync.WaitGroup
	)
	b.ResetTimer()
	for range g {
		wg.Go(func() {
			for !stopped.Load() {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				if err := op(int(i)); err != nil {
					errOnce.Do(func() { firstEr = err })
					stopped.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if firstEr != nil {
		b.Fatal(firstEr)
	}
	reportOpsPerSec(b)
}

func reportOpsPerSec(b *testing.B) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(b.N)/s, "ops/s")
	}
}

// parallelFill calls op n times over g goroutines, untimed: setup.
func parallelFill(g, n int, op func(i int) error) error {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		err  error
	)
	for range g {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				if e := op(int(i)); e != nil {
					mu.Lock()
					if err == nil {
						err = e
					}
					mu.Unlock()
					next.Store(int64(n))
					return
				}
			}
		})
	}
	wg.Wait()
	return err
}

// warnCounter is a slog.Handler that counts warnings: a Throttler logs one
// when a store call fails and it falls back, which would make a store
// benchmark measure the fallback instead.
type warnCounter struct{ n atomic.Int64 }

func (w *warnCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnCounter) Handle(context.Context, slog.Record) error    { w.n.Add(1); return nil }
func (w *warnCounter) WithAttrs([]slog.Attr) slog.Handler           { return w }
func (w *warnCounter) WithGroup(string) slog.Handler                { return w }

func (w *warnCounter) check(b *testing.B) {
	b.Helper()
	if n := w.n.Load(); n > 0 {
		b.Fatalf("the throttler fell back from its store %d times: the figures would not be the store's", n)
	}
}

// hosts returns n distinct target host names.
func hosts(n int) []string {
	hs := make([]string, n)
	for i := range hs {
		hs[i] = fmt.Sprintf("t%d.bench.test", i)
	}
	return hs
}

// serverStats reads what the server spent on scripts since the last
// CONFIG RESETSTAT (INFO commandstats' usec and calls of EVALSHA and EVAL),
// and the CPU time the server and this process used since reset.
type serverStats struct {
	c                  *redis.Client
	serverCPU, selfCPU time.Duration // at reset
}

func (s *serverStats) reset(b *testing.B) {
	if err := s.c.ConfigResetStat(context.Background()).Err(); err != nil {
		b.Fatal(err)
	}
	s.serverCPU, s.selfCPU = s.serverCPUTime(b), processCPUTime()
}

// serverCPUTime is the CPU time (user and system) the server has used, from
// INFO cpu.
func (s *serverStats) serverCPUTime(b *testing.B) time.Duration {
	info, err := s.c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sec float64
	for line := range strings.Lines(info) {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (name == "used_cpu_sys" || name == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu: %s: %v", line, err)
			}
			sec += f
		}
	}
	return time.Duration(sec * float64(time.Second))
}

// report adds server-µs/op, the server's time inside scripts per op,
// calls/op, the script runs per op (below 1 when calls are shared), and the
// CPU time per op of the server (server-cpu-µs/op, its network work
// included) and of this process (client-cpu-µs/op, where the OS reports it).
func (s *serverStats) report(b *testing.B) {
	serverCPU, selfCPU := s.serverCPUTime(b), processCPUTime()
	usec, calls := s.scripts(b)
	b.ReportMetric(usec/float64(b.N), "server-µs/op")
	b.ReportMetric(calls/float64(b.N), "calls/op")
	b.ReportMetric(float64(serverCPU-s.serverCPU)/float64(time.Microsecond)/float64(b.N), "server-cpu-µs/op")
	if selfCPU > 0 {
		b.ReportMetric(float64(selfCPU-s.selfCPU)/float64(time.Microsecond)/float64(b.N), "client-cpu-µs/op")
	}
}

// scripts returns the time (µs) the server spent in scripts and how many
// it ran since the last reset (INFO commandstats: EVALSHA and EVAL).
func (s *serverStats) scripts(b *testing.B) (usec, calls float64) {
	info, err := s.c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		for kv := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			f, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "usec":
				usec += f
			case "calls":
				calls += f
			}
		}
	}
	return usec, calls
}
