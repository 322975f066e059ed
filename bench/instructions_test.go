package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"

	"github.com/fleetgate/fleetgate/throttle"
)

// BenchmarkScriptInstructions counts the server's instructions per decision:
// redis-server runs under valgrind's callgrind, which counts instructions,
// not seconds, so the figure is the same from run to run whatever else the
// machine is doing (the other benchmarks' times on a shared two-core
// machine move by ±20%). Each case makes 2,000 decisions through the
// public API after 1,000 of warm-up, and reports server-instructions/op:
// everything the server ran for them, its network and event loop included.
// Under valgrind the server runs some 50 times slower, so each log holds
// fewer entries than in BenchmarkRedisDecisions (hot/allowed keeps about a
// hundred), and the cases spread over 100 targets, not 1,000: each target
// then sees several decisions a second, as in BenchmarkRedisDecisions, and
// a process marks itself live on it (every 2.5 s) on a similar share of
// them.
//
// It needs valgrind and callgrind_control on PATH (Debian: apt-get install
// valgrind) and skips without them.
func BenchmarkScriptInstructions(b *testing.B) {
	for _, tool := range []string{"valgrind", "callgrind_control"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Skipf("%s is not on PATH: %v", tool, err)
		}
	}
	srv := startWrapped(b, "valgrind", "--tool=callgrind", "--callgrind-out-file=callgrind.out")
	cases := []struct {
		name    string
		targets int
		g       int
		rule    string // fleetgate's; redis_rate gets the same limit
	}{
		{"hot/allowed", 1, 1, allowedRule},
		{"100/allowed", 100, 1, allowedRule},
		{"100/allowed", 100, 8, allowedRule},
		// A longer window: logs of about five live entries, as over 1,000
		// targets in BenchmarkRedisDecisions at full speed.
		{"100/allowed-500ms", 100, 1, "100000/500ms"},
		{"100/allowed-500ms", 100, 8, "100000/500ms"},
		{"100/refused", 100, 1, refusedRule},
		{"100/refused", 100, 8, refusedRule},
	}
	ctx := context.Background()
	for _, c := range cases {
		hs := hosts(c.targets)
		fg, warn := redisThrottler(b, srv.client(b), keyPrefix(), c.rule, throttle.WithStoreTimeout(10*time.Second))
		rl, rlPrefix := redis_rate.NewLimiter(srv.client(b)), keyPrefix()
		sc := decisionScenario{refused: c.rule == refusedRule}
		rlim := sc.rateLimit()
		ops := map[string]func(i int) error{
			"fleetgate": func(i int) error {
				_, err := fg.Allow(ctx, hs[i%len(hs)])
				return err
			},
			"redis_rate": func(i int) error {
				_, err := rl.Allow(ctx, rlPrefix+hs[i%len(hs)], rlim)
				return err
			},
		}
		for _, lib := range []string{"fleetgate", "redis_rate"} {
			// One run is the measurement; a second call with a larger b.N
			// reports the same figures.
			var instr, calls float64
			b.Run(fmt.Sprintf("%s/g=%d/%s", c.name, c.g, lib), func(b *testing.B) {
				if instr == 0 {
					instr, calls = countInstructions(b, srv, c.g, ops[lib])
				}
				b.ReportMetric(instr, "server-instructions/op")
				b.ReportMetric(calls, "calls/op")
			})
			warn.check(b)
		}
	}
}

// countInstructions makes 1,000 decisions with op, zeroes the server's
// counters, makes 2,000 more over g goroutines and returns the server's
// instructions and script calls per decision among those.
func countInstructions(b *testing.B, srv *redisServer, g int, op func(i int) error) (instr, calls float64) {
	const warm, n = 1000, 2000
	for i := range warm {
		if err := op(i); err != nil {
			b.Fatal(err)
		}
	}
	stats := &serverStats{c: srv.client(b)}
	stats.reset(b)
	callgrind(b, "--zero", srv)
	if err := parallelFill(g, n, func(i int) error { return op(warm + i) }); err != nil {
		b.Fatal(err)
	}
	ran := callgrind(b, "--dump", srv)
	_, scripts := stats.scripts(b)
	return ran / n, scripts / n
}

// callgrind runs callgrind_control with the action (--zero or --dump) on
// the server and, after a dump, returns the instructions it counted since
// the last zero, read from the newest dump file.
func callgrind(b *testing.B, action string, srv *redisServer) float64 {
	if out, err := exec.Command("callgrind_control", action, strconv.Itoa(srv.Pid)).CombinedOutput(); err != nil {
		b.Fatalf("callgrind_control %s: %v\n%s", action, err, out)
	}
	if action != "--dump" {
		return 0
	}
	dumps, err := filepath.Glob(filepath.Join(srv.Dir, "callgrind.out.*"))
	if err != nil || len(dumps) == 0 {
		b.Fatalf("no callgrind dump in %s (%v)", srv.Dir, err)
	}
	newest, newestN := "", -1
	for _, d := range dumps {
		if k, err := strconv.Atoi(d[strings.LastIndexByte(d, '.')+1:]); err == nil && k > newestN {
			newest, newestN = d, k
		}
	}
	f, err := os.Open(newest)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "summary: "); ok {
			n, err := strconv.ParseFloat(strings.Fields(v)[0], 64)
			if err != nil {
				b.Fatalf("%s: %v", newest, err)
			}
			return n
		}
	}
	b.Fatalf("%s has no summary line (%v)", newest, sc.Err())
	return 0
}
