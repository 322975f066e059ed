package bench

import (
	"context"
	"net"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// hookFunc is a redis.Hook that calls f with every command before it is
// sent, pipelined ones included.
type hookFunc func(redis.Cmder)

func (f hookFunc) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return next(ctx, network, addr)
	}
}

func (f hookFunc) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		f(cmd)
		return next(ctx, cmd)
	}
}

func (f hookFunc) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			f(c)
		}
		return next(ctx, cmds)
	}
}

// scriptCounter counts script runs (EVALSHA and EVAL, each a round trip)
// and every other command, sent through the clients it is hooked into.
type scriptCounter struct {
	scripts atomic.Int64
	other   atomic.Int64
}

func (s *scriptCounter) hook() redis.Hook {
	return hookFunc(func(cmd redis.Cmder) {
		switch strings.ToLower(cmd.Name()) {
		case "evalsha", "eval", "evalsha_ro", "eval_ro":
			s.scripts.Add(1)
		default:
			s.other.Add(1)
		}
	})
}
