package bench

import (
	"context"
	"encoding/csv"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// BenchmarkRedisPing is the floor of every Redis decision: one go-redis round
// trip to the same kind of local server, at exactly 1 and 8 goroutines.
func BenchmarkRedisPing(b *testing.B) {
	srv := startRedis(b)
	c := srv.client(b)
	ctx := context.Background()
	for _, g := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("g=%d", g), func(b *testing.B) {
			runGoroutines(b, g, func(int) error { return c.Ping(ctx).Err() })
		})
	}
}

// BenchmarkRedisBenchmarkTool runs redis-benchmark (the server's own C
// client, no Go in the path) against a fresh server: EVALSHA of a trivial
// script and of redis_rate's GCRA script, with 1 and 8 connections. ns/op
// is meaningless here; read ops/s. (fleetgate's reserve takes its numbers
// as binary, which redis-benchmark's command line cannot carry: its script
// cost is BenchmarkScriptInstructions'.)
func BenchmarkRedisBenchmarkTool(b *testing.B) {
	tool, err := exec.LookPath("redis-benchmark")
	if err != nil {
		b.Skip("redis-benchmark is not on PATH")
	}
	srv := startRedis(b)
	c := srv.client(b)
	ctx := context.Background()
	load := func(src string) string {
		sha, err := c.ScriptLoad(ctx, src).Result()
		if err != nil {
			b.Fatal(err)
		}
		return sha
	}
	trivial := load("return 1")
	gcra := redisRateSHA(b, srv)
	pfx := keyPrefix()
	// __rand_int__ is replaced by redis-benchmark with a random number from
	// 0 to -r: keys spread over many targets. redis_rate's arguments are
	// those of BenchmarkRedisDecisions' allowed limit (burst, rate, period
	// in seconds, cost), at which its script writes on every call.
	limit := []string{strconv.Itoa(allowedLimit), strconv.Itoa(allowedLimit), strconv.FormatFloat(allowedWindow.Seconds(), 'g', -1, 64), "1"}
	cmds := []struct {
		name    string
		args    []string
		written string // a key the run must leave behind
	}{
		{"trivial", []string{"EVALSHA", trivial, "0"}, ""},
		{"redis_rate/hot/allowed", append([]string{"EVALSHA", gcra, "1", "rate:" + pfx + "hot"}, limit...), "rate:" + pfx + "hot"},
		{"redis_rate/many/allowed", append([]string{"EVALSHA", gcra, "1", "rate:" + pfx + "t__rand_int__"}, limit...), ""},
	}
	for _, cmd := range cmds {
		for _, conns := range []int{1, 8} {
			// One run of the tool is the measurement. The testing package
			// may call the function again with a larger b.N when the run
			// was short; it then reports the same figure.
			var rps float64
			b.Run(fmt.Sprintf("%s/c=%d", cmd.name, conns), func(b *testing.B) {
				if rps == 0 {
					args := append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(srv.Port), "-n", "100000", "-c", strconv.Itoa(conns), "-r", "1000", "--csv"}, cmd.args...)
					out, err := exec.Command(tool, args...).CombinedOutput()
					if err != nil {
						b.Fatalf("redis-benchmark: %v\n%s", err, out)
					}
					if rps, err = parseRPS(string(out)); err != nil {
						b.Fatalf("%v\n%s", err, out)
					}
					if cmd.written != "" {
						checkWritten(b, c, cmd.written)
					}
				}
				b.ReportMetric(rps, "ops/s")
			})
		}
	}
}

// parseRPS reads the requests per second from redis-benchmark --csv.
func parseRPS(out string) (float64, error) {
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		return 0, err
	}
	for _, r := range recs {
		if len(r) >= 2 && r[0] != "test" {
			return strconv.ParseFloat(r[1], 64)
		}
	}
	return 0, fmt.Errorf("no figure in redis-benchmark output")
}

// redisRateSHA runs one redis_rate decision on srv, which loads its script,
// and returns the script's SHA1 as the client sent it in EVALSHA.
func redisRateSHA(b *testing.B, srv *redisServer) string {
	var sha string
	spy := hookFunc(func(cmd redis.Cmder) {
		if args := cmd.Args(); strings.EqualFold(cmd.Name(), "evalsha") && len(args) > 1 {
			sha, _ = args[1].(string)
		}
	})
	if _, err := redis_rate.NewLimiter(srv.client(b, spy)).Allow(context.Background(), "sha-probe", redis_rate.PerSecond(1)); err != nil {
		b.Fatal(err)
	}
	if sha == "" {
		b.Fatal("redis_rate sent no EVALSHA")
	}
	return sha
}
