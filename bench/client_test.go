package bench

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// cannedScripts is a redis.Hook that answers every EVALSHA itself with
// reply(), without sending it; every other command goes to the server.
type cannedScripts func() any

func (f cannedScripts) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return next(ctx, network, addr)
	}
}

func (f cannedScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if c, ok := cmd.(*redis.Cmd); ok && strings.EqualFold(cmd.Name(), "evalsha") {
			c.SetVal(f())
			return nil
		}
		return next(ctx, cmd)
	}
}

func (f cannedScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// BenchmarkClientDecisions measures what a decision costs the client alone:
// the scenario many/allowed of BenchmarkRedisDecisions at 1 goroutine, with
// each library's script reply canned by a hook (granted at once), so that
// neither the network nor the server counts. What is left is the library's
// own work and go-redis building the command: the part of a 1-goroutine
// decision's time that is fleetgate's to cut on the client.
func BenchmarkClientDecisions(b *testing.B) {
	srv := startRedis(b)
	hs := hosts(1000)
	ctx := context.Background()
	b.Run("fleetgate", func(b *testing.B) {
		// now, then the target's remaining, reset, live and pause (us),
		// then the request's delay: lua/sliding_log.lua's reply.
		c := srv.client(b, cannedScripts(func() any {
			return []any{time.Now().UnixMicro(), int64(allowedLimit - 1), allowedWindow.Microseconds(), int64(1), int64(0), int64(0)}
		}))
		thr, warn := redisThrottler(b, c, keyPrefix(), allowedRule)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			d, err := thr.Allow(ctx, hs[i%len(hs)])
			if err != nil || !d.Allowed {
				b.Fatalf("decision %d: %+v, %v", i, d, err)
			}
		}
		b.StopTimer()
		warn.check(b)
	})
	b.Run("redis_rate", func(b *testing.B) {
		// allowed, remaining, retry after and reset after (s, as text):
		// redis_rate's reply.
		c := srv.client(b, cannedScripts(func() any {
			return []any{int64(1), int64(allowedLimit - 1), "-1", "0.000001"}
		}))
		rl := redis_rate.NewLimiter(c)
		lim := decisionScenario{targets: 1000}.rateLimit()
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			r, err := rl.Allow(ctx, hs[i%len(hs)], lim)
			if err != nil || r.Allowed != 1 {
				b.Fatalf("decision %d: %+v, %v", i, r, err)
			}
		}
	})
}
