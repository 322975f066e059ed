package redistest_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

func TestStartServer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv := redistest.StartServer(t)
	rdb := srv.Client(t)
	key := redistest.KeyPrefix(t) + "k"

	require.NoError(t, rdb.Set(ctx, key, "v", time.Minute).Err())
	got, err := rdb.Get(ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, "v", got)

	require.Regexp(t, `^127\.0\.0\.1:\d+$`, srv.Addr)
	require.NotEqual(t, "127.0.0.1:6379", srv.Addr)
	opts, err := redis.ParseURL(srv.URL())
	require.NoError(t, err)
	require.Equal(t, srv.Addr, opts.Addr)
	require.Equal(t, 0, opts.DB)

	// Persistence is off, so Restart really starts empty.
	cfg, err := rdb.ConfigGet(ctx, "*").Result()
	require.NoError(t, err)
	require.Equal(t, "", cfg["save"])
	require.Equal(t, "no", cfg["appendonly"])
	require.Equal(t, "no", cfg["protected-mode"])
}

func TestStartServerExtraArgs(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, "--maxmemory", "1mb", "--appendonly", "yes")
	cfg, err := srv.Client(t).ConfigGet(t.Context(), "*").Result()
	require.NoError(t, err)
	require.Equal(t, "1048576", cfg["maxmemory"])
	require.Equal(t, "yes", cfg["appendonly"], "extraArgs override the defaults")
}

func TestServerKillRestart(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv := redistest.StartServer(t)
	addr := srv.Addr
	rdb := srv.Client(t)
	key := redistest.KeyPrefix(t) + "k"
	require.NoError(t, rdb.Set(ctx, key, "v", time.Minute).Err())

	srv.Kill(t)
	srv.Kill(t) // a second Kill does nothing
	// A client that does not retry, to keep the test fast; rdb itself would
	// retry its dials for a second or two before failing the same way.
	once := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialerRetries: 1})
	defer once.Close()
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.ErrorContains(t, once.Ping(pingCtx).Err(), "connection refused", "PING after Kill")

	srv.Restart(t)
	require.Equal(t, addr, srv.Addr, "Restart keeps the address")
	require.NoError(t, rdb.Ping(ctx).Err(), "PING after Restart")
	require.ErrorIs(t, rdb.Get(ctx, key).Err(), redis.Nil, "data is gone after Restart")

	// Restart of a running server kills it first.
	require.NoError(t, rdb.Set(ctx, key, "v", time.Minute).Err())
	srv.Restart(t)
	require.ErrorIs(t, rdb.Get(ctx, key).Err(), redis.Nil)
}

// Not parallel, so that no other test can take the port once it is free.
func TestServerCleanupKillsProcess(t *testing.T) {
	var addr string
	t.Run("server", func(t *testing.T) {
		addr = redistest.StartServer(t).Addr
	})
	// The subtest's Cleanup has run: nothing answers on its port any more.
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		conn.Close()
	}
	require.Error(t, err, "dial %s after the test ended", addr)
}

func TestStartCluster(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cluster := redistest.StartCluster(t)
	require.Len(t, cluster.Addrs, 3)
	rdb := cluster.Client(t)
	prefix := redistest.KeyPrefix(t)

	// {a}, {b} and {c} hash to slots owned by three different masters.
	keys := map[string]int64{"{a}x": 15495, "{b}x": 3300, "{c}x": 7365}
	owners := map[string]string{}
	for key, wantSlot := range keys {
		slot, err := rdb.ClusterKeySlot(ctx, key).Result()
		require.NoError(t, err)
		require.Equal(t, wantSlot, slot, "CLUSTER KEYSLOT %s", key)

		master, err := rdb.MasterForKey(ctx, prefix+key)
		require.NoError(t, err)
		owners[master.Options().Addr] = key

		require.NoError(t, rdb.Set(ctx, prefix+key, key, time.Minute).Err())
	}
	require.Len(t, owners, 3, "keys land on three masters: %v", owners)
	// redis-cli gives the masters slot ranges in the order of Addrs.
	require.Equal(t, "{b}x", owners[cluster.Addrs[0]])
	require.Equal(t, "{c}x", owners[cluster.Addrs[1]])
	require.Equal(t, "{a}x", owners[cluster.Addrs[2]])

	opts, err := redis.ParseClusterURL(cluster.URL())
	require.NoError(t, err)
	require.Equal(t, cluster.Addrs, opts.Addrs)
	fromURL := redis.NewClusterClient(opts)
	t.Cleanup(func() { fromURL.Close() })
	for key := range keys {
		got, err := fromURL.Get(ctx, prefix+key).Result()
		require.NoError(t, err)
		require.Equal(t, key, got)
	}
}

func TestStartSentinel(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	master := redistest.StartServer(t)
	sentinel := redistest.StartSentinel(t, master, "m1")
	require.NotEqual(t, master.Addr, sentinel.Addr)

	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m1", SentinelAddrs: []string{sentinel.Addr}})
	t.Cleanup(func() { rdb.Close() })
	key := redistest.KeyPrefix(t) + "k"
	require.NoError(t, rdb.Set(ctx, key, "v", time.Minute).Err())
	got, err := master.Client(t).Get(ctx, key).Result()
	require.NoError(t, err, "the Sentinel led the client to the master")
	require.Equal(t, "v", got)

	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel.Addr})
	t.Cleanup(func() { sc.Close() })
	addr, err := sc.GetMasterAddrByName(ctx, "m1").Result()
	require.NoError(t, err)
	require.Equal(t, master.Addr, addr[0]+":"+addr[1])
}

func TestKeyPrefix(t *testing.T) {
	t.Parallel()
	a, b := redistest.KeyPrefix(t), redistest.KeyPrefix(t)
	require.Regexp(t, `^fgtest:[0-9a-f]{16}:$`, a)
	require.NotEqual(t, a, b)
}

func TestStartServerFailureQuotesLog(t *testing.T) {
	t.Parallel()
	msg := fatalMessage(t, func(tb testing.TB) { redistest.StartServer(tb, "--no-such-directive", "x") })
	require.Contains(t, msg, "redis-server exited before answering")
	require.Contains(t, msg, "no-such-directive", "the message quotes redis-server's complaint")
}

// fatalTB records the message of a Fatal call instead of failing the test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	runtime.Goexit()
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (f *fatalTB) Skip(args ...any)                 { panic("redistest must not skip") }
func (f *fatalTB) Skipf(format string, args ...any) { panic("redistest must not skip") }
func (f *fatalTB) SkipNow()                         { panic("redistest must not skip") }

// fatalMessage runs fn with a fatalTB on its own goroutine, as testing does,
// and returns the message fn failed with.
func fatalMessage(t *testing.T, fn func(tb testing.TB)) string {
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(tb)
	}()
	<-done
	return tb.msg
}

// Not parallel: t.Setenv changes PATH for the whole process.
func TestMissingBinaries(t *testing.T) {
	serverBin, err := exec.LookPath("redis-server")
	require.NoError(t, err)
	onlyServer := t.TempDir()
	require.NoError(t, os.Symlink(serverBin, filepath.Join(onlyServer, "redis-server")))

	const install = " not found in PATH: install it (apt-get install redis-server) or run scripts/install-redis.sh"
	tests := []struct {
		name string
		path string
		fn   func(tb testing.TB)
		want string
	}{
		{"server/no redis-server", t.TempDir(), func(tb testing.TB) { redistest.StartServer(tb) }, "redis-server" + install},
		{"cluster/no redis-server", t.TempDir(), func(tb testing.TB) { redistest.StartCluster(tb) }, "redis-server" + install},
		{"cluster/no redis-cli", onlyServer, func(tb testing.TB) { redistest.StartCluster(tb) }, "redis-cli" + install},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("PATH", tt.path)
			require.Equal(t, tt.want, fatalMessage(t, tt.fn))
		})
	}
}
