package throttle

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestMain silences go-redis's own logger: the tests kill Redis on purpose,
// and its dial errors would bury the test output.
func TestMain(m *testing.M) {
	redis.SetLogger(quietRedisLogger{})
	os.Exit(m.Run())
}

type quietRedisLogger struct{}

func (quietRedisLogger) Printf(context.Context, string, ...any) {}
