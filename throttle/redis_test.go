package throttle

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

func TestRedisStoreKeysShareASlotAndExpire(t *testing.T) {
	cluster := redistest.StartCluster(t)
	client := cluster.Client(t)
	ctx := context.Background()
	prefix := redistest.KeyPrefix(t)
	s, err := NewRedisStore(client, WithKeyPrefix(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })

	for _, target := range []string{"example.com", "we{ir}d", "}{", "a%7Bb"} {
		keys := append(s.keys(target), s.epochKey(target))
		var slots []int64
		for _, k := range keys {
			slot, err := client.ClusterKeySlot(ctx, k).Result()
			require.NoError(t, err)
			slots = append(slots, slot)
		}
		require.Equal(t, []int64{slots[0], slots[0], slots[0], slots[0]}, slots, "keys of %q: %v", target, keys)

		g := make([]Grant, 2)
		_, err := s.Reserve(ctx, target, Limit{Limit: 1, Window: time.Second}, []Request{{ID: 1, N: 1, MaxWait: -1}, {ID: 2, N: 1, MaxWait: -1}}, g)
		require.NoError(t, err)
		// The slot's data is young (the cluster is new): the target is
		// held for a horizon (here a window) and a window.
		require.InDelta(t, 2*time.Second, g[0].Delay, float64(100*time.Millisecond), "the first booking of %q", target)
		ttl, err := client.PTTL(ctx, keys[3]).Result()
		require.NoError(t, err)
		require.Greater(t, ttl, 23*time.Hour, "the epoch of %q's slot", target)
		require.LessOrEqual(t, ttl, 24*time.Hour, "the epoch of %q's slot", target)
		keys = keys[:3]
		_, err = s.Pause(ctx, target, 500*time.Millisecond)
		require.NoError(t, err)
		// A read carries the epoch key of the target's slot, which must
		// share the slot with the target's keys.
		left, err := s.Pause(ctx, target, 0)
		require.NoError(t, err)
		require.InDelta(t, 2*time.Second, left, float64(300*time.Millisecond), "%q: the young slot's hold, longer than the pause", target)
		for _, k := range keys {
			ttl, err := client.PTTL(ctx, k).Result()
			require.NoError(t, err)
			if ttl == -2 && k == keys[0] { // go-redis: no such key
				continue // no list: the log is inline, in meta
			}
			require.Greater(t, ttl, time.Duration(0), "key %s must have a TTL", k)
			require.LessOrEqual(t, ttl, 20*time.Second, "key %s", k)
		}
		require.Len(t, logOf(t, client, s, target), 2)
		log := logTTL(t, client, s, target)
		// The second booking is a second after the first: the log lasts
		// its window past it, and three spares (half the window, at least
		// 0.5 s).
		require.Greater(t, log, 4*time.Second+500*time.Millisecond, "the log outlives its last booking's window and a spare")
		// Three spares; an inline log lasts as long as meta, which keeps
		// the live count for the liveness.
		require.LessOrEqual(t, log, max(3500*time.Millisecond, livenessFor(defaultLiveness, time.Second))+time.Millisecond)
	}
	_, err = NewRedisStore(client, WithKeyPrefix("bad{"))
	require.Error(t, err)
}

func TestRedisStoreEntriesAreUniqueAcrossProcesses(t *testing.T) {
	client := redistest.StartServer(t).Client(t)
	ctx := context.Background()
	prefix := redistest.KeyPrefix(t)
	a, err := NewRedisStore(client, WithKeyPrefix(prefix))
	require.NoError(t, err)
	b, err := NewRedisStore(client, WithKeyPrefix(prefix))
	require.NoError(t, err)
	ageData(t, client, a)
	lim := Limit{Limit: 10, Window: time.Minute}
	g := make([]Grant, 1)
	for _, s := range []*RedisStore{a, b} {
		st, err := s.Reserve(ctx, "example.com", lim, []Request{{ID: 7, N: 1, MaxWait: -1}}, g)
		require.NoError(t, err)
		require.True(t, g[0].OK)
		_ = st
	}
	st, err := a.Reserve(ctx, "example.com", lim, []Request{{ID: 8, N: 3, MaxWait: -1}}, g)
	require.NoError(t, err)
	require.Equal(t, 5, st.Remaining, "same ids in two processes and the units of one request are distinct entries")
	require.Len(t, logOf(t, client, a, "example.com"), 5)
	procs, err := client.ZRange(ctx, a.keys("example.com")[2], 0, -1).Result()
	require.NoError(t, err)
	require.ElementsMatch(t, []string{a.Process(), b.Process()}, procs, "both processes are in the heartbeat")

	c, err := NewRedisStore(client, WithKeyPrefix(prefix))
	require.NoError(t, err)
	for range 2 { // the first call marks and counts, the second reads the count
		st, err = c.Reserve(ctx, "example.com", lim, []Request{{ID: 1, N: 1, MaxWait: -1}}, g)
		require.NoError(t, err)
		require.Equal(t, 3, st.Live, "every call learns the live processes")
	}
}

func TestRedisStoreSurvivesScriptFlushAndRestart(t *testing.T) {
	srv := redistest.StartServer(t)
	client := srv.Client(t)
	ctx := context.Background()
	s, err := NewRedisStore(client, WithKeyPrefix(redistest.KeyPrefix(t)))
	require.NoError(t, err)
	ageData(t, client, s)
	lim := Limit{Limit: 10, Window: time.Second}
	g := make([]Grant, 1)
	_, err = s.Reserve(ctx, "example.com", lim, []Request{{ID: 1, N: 1}}, g)
	require.NoError(t, err)
	require.NoError(t, client.ScriptFlush(ctx).Err())
	_, err = s.Reserve(ctx, "example.com", lim, []Request{{ID: 2, N: 1}}, g)
	require.NoError(t, err, "EVAL must take over after NOSCRIPT")
	require.True(t, g[0].OK)

	srv.Kill(t)
	_, err = s.Reserve(ctx, "example.com", lim, []Request{{ID: 3, N: 1}}, g)
	require.Error(t, err)
	srv.Restart(t)
	require.Eventually(t, func() bool {
		_, err := s.Reserve(ctx, "example.com", lim, []Request{{ID: 4, N: 1}}, g)
		return err == nil && g[0].OK
	}, 5*time.Second, 50*time.Millisecond)
	require.NoError(t, s.Probe(ctx))
}

// TestProbeWantsAMaster: a replica and a Sentinel answer PING but take no
// script run; Probe must not report them as a store that is back, or a
// process would leave its fallback only to fail again, over and over.
func TestProbeWantsAMaster(t *testing.T) {
	ctx := context.Background()
	master := redistest.StartServer(t)
	replica := redistest.StartServer(t, "--replicaof", "127.0.0.1", strings.TrimPrefix(master.Addr, "127.0.0.1:"))
	sentinel := redistest.StartSentinel(t, master, "m")
	locked := redistest.StartServer(t)
	require.NoError(t, locked.Client(t).ConfigSet(ctx, "requirepass", "s3cret").Err())
	for _, tt := range []struct {
		name, addr, want string
	}{
		{"master", master.Addr, ""},
		{"wrong password", locked.Addr, "NOAUTH"},
		{"replica", replica.Addr, "is a slave, not a master"},
		{"sentinel", sentinel.Addr, "is a sentinel, not a master"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			client := redis.NewClient(&redis.Options{Addr: tt.addr, ContextTimeoutEnabled: true})
			t.Cleanup(func() { client.Close() })
			s, err := NewRedisStore(client, WithKeyPrefix(redistest.KeyPrefix(t)))
			require.NoError(t, err)
			err = s.Probe(ctx)
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.want)
			g := make([]Grant, 1)
			_, err = s.Reserve(ctx, "example.com", Limit{Limit: 10, Window: time.Second}, []Request{{ID: 1, N: 1}}, g)
			require.Error(t, err, "no script run works there either")
		})
	}
}

// TestProbeReadiesTheStore: a Probe that finds the store up loads the
// script on every master, so that the first decision is one EVALSHA, not
// a NOSCRIPT answer and an EVAL of the whole script.
func TestProbeReadiesTheStore(t *testing.T) {
	ctx := context.Background()
	cluster := redistest.StartCluster(t).Client(t)
	for name, client := range map[string]redis.UniversalClient{
		"single node": redistest.StartServer(t).Client(t),
		"cluster":     cluster,
	} {
		t.Run(name, func(t *testing.T) {
			var names []string
			hook := &scriptHook{before: func(_ int64, args []any) { names = append(names, args[0].(string)) }}
			client.AddHook(hook)
			s, err := NewRedisStore(client, WithKeyPrefix(redistest.KeyPrefix(t)))
			require.NoError(t, err)
			t.Cleanup(func() { s.Close() })
			masters := func() (loaded []bool) {
				t.Helper()
				var mu sync.Mutex // ForEachMaster calls check concurrently
				check := func(ctx context.Context, m *redis.Client) error {
					have, err := m.ScriptExists(ctx, slidingLog.sha).Result()
					mu.Lock()
					defer mu.Unlock()
					loaded = append(loaded, err == nil && have[0])
					return err
				}
				if c, ok := client.(*redis.ClusterClient); ok {
					require.NoError(t, c.ForEachMaster(ctx, check))
				} else {
					require.NoError(t, check(ctx, client.(*redis.Client)))
				}
				return loaded
			}
			for _, loaded := range masters() {
				require.False(t, loaded, "a fresh server has no script")
			}
			require.NoError(t, s.Probe(ctx))
			for i, loaded := range masters() {
				require.True(t, loaded, "master %d has the script after a probe", i)
			}
			g := make([]Grant, 1)
			_, err = s.Reserve(ctx, "example.com", Limit{Limit: 10, Window: time.Second}, []Request{{ID: 1, N: 1, MaxWait: -1}}, g)
			require.NoError(t, err)
			require.Equal(t, []string{"evalsha"}, names, "the first decision is one script run")
			require.True(t, s.warmed.Load(), "the client was readied")
		})
	}
}

// TestStoreErrorsNeverShowThePassword: a server that does not know AUTH
// quotes the connection's AUTH, password and all, in the error of every
// call (a long password cut at 128 bytes); the store's errors and the
// Throttler's log lines show "***" instead.
func TestStoreErrorsNeverShowThePassword(t *testing.T) {
	ctx := context.Background()
	srv := redistest.StartServer(t, "--rename-command", "AUTH", "", "--rename-command", "HELLO", "")
	for _, password := range []string{"Sup3rS3cret-pw", "a", strings.Repeat("Z", 150)} {
		t.Run(fmt.Sprintf("%d bytes", len(password)), func(t *testing.T) {
			client := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "admin", Password: password, ContextTimeoutEnabled: true})
			t.Cleanup(func() { client.Close() })
			shown := password[:min(len(password), 20)]
			require.ErrorContains(t, client.Ping(ctx).Err(), "'admin' '"+shown, "the server must quote the password for this test to mean anything")

			s, err := NewRedisStore(client, WithKeyPrefix(redistest.KeyPrefix(t)))
			require.NoError(t, err)
			err = s.Probe(ctx)
			require.Error(t, err)
			require.Equal(t, "ERR unknown command 'auth', with args beginning with: ***", err.Error())
			_, err = s.Reserve(ctx, "example.com", Limit{Limit: 10, Window: time.Second}, []Request{{ID: 1, N: 1}}, make([]Grant, 1))
			require.Error(t, err)
			require.NotContains(t, err.Error(), "'admin' '"+shown)
			require.Contains(t, err.Error(), "with args beginning with: ***")

			var logged strings.Builder
			rules, err := ParseRules("*=10/1s")
			require.NoError(t, err)
			thr, err := New(rules, WithStore(s), WithFailurePolicy(FailOpen),
				WithLogger(slog.New(slog.NewTextHandler(&lockedWriter{w: &logged}, nil))))
			require.NoError(t, err)
			t.Cleanup(func() { thr.Close() })
			d, err := thr.Allow(ctx, "example.com")
			require.NoError(t, err)
			require.True(t, d.Allowed, "open admits when the store fails")
			require.NoError(t, thr.Close())
			require.Contains(t, logged.String(), "with args beginning with: ***", "the store's failure is logged")
			require.NotContains(t, logged.String(), "'admin' '"+shown)
		})
	}
}

// TestStoreErrorsNeverShowASentinelsPassword: the Sentinel's password is
// not in the options of the client NewFailoverClient makes, so the store
// cannot know it; a Sentinel (or a proxy in front of one) that does not
// know AUTH quotes it all the same, and the store's errors cut that echo
// whatever the passwords they know.
func TestStoreErrorsNeverShowASentinelsPassword(t *testing.T) {
	const password = "S3ntinel-S3cret"
	srv := redistest.StartServer(t, "--rename-command", "AUTH", "", "--rename-command", "HELLO", "")
	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: "fleet", SentinelAddrs: []string{srv.Addr}, SentinelPassword: password,
		ContextTimeoutEnabled: true, MaxRetries: -1,
	})
	t.Cleanup(func() { client.Close() })
	s, err := NewRedisStore(client, WithKeyPrefix(redistest.KeyPrefix(t)))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = s.Reserve(ctx, "example.com", Limit{Limit: 10, Window: time.Second}, []Request{{ID: 1, N: 1}}, make([]Grant, 1))
	require.Error(t, err)
	require.Contains(t, err.Error(), "with args beginning with: ***", "the Sentinel quoted the AUTH")
	require.NotContains(t, err.Error(), password)
	err = s.Probe(ctx)
	require.Error(t, err)
	require.NotContains(t, err.Error(), password)
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestHidePasswords: the passwords of every kind of client the store knows,
// and errors.Is still answering through a hidden error.
func TestHidePasswords(t *testing.T) {
	for _, c := range []redis.UniversalClient{
		redis.NewClient(&redis.Options{Password: "pw1"}),
		redis.NewClusterClient(&redis.ClusterOptions{Password: "pw1"}),
		redis.NewRing(&redis.RingOptions{Password: "pw1"}),
	} {
		require.Equal(t, []string{"pw1"}, passwordsOf(c), "%T", c)
		c.Close()
	}
	plain := redis.NewClient(&redis.Options{})
	defer plain.Close()
	require.Empty(t, passwordsOf(plain))

	const pw = "Sup3rS3cret-pw"
	cause := fmt.Errorf("dial: "+pw+" refused: %w", context.DeadlineExceeded)
	err := hidePasswords(fmt.Errorf("store: %w", cause), []string{pw})
	require.EqualError(t, err, "store: dial: *** refused: context deadline exceeded")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	other := errors.New("no secret here")
	require.Same(t, other, hidePasswords(other, []string{pw}))
	require.NoError(t, hidePasswords(nil, []string{pw}))

	// A Redis error stays one, its text hidden too: redis.HasErrorPrefix
	// (CROSSSLOT, NOSCRIPT) still reads it.
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	rerr := c.Do(context.Background(), "CROSSSLOTX", pw).Err()
	require.ErrorContains(t, rerr, pw)
	err = hidePasswords(fmt.Errorf("run: %w", rerr), []string{pw})
	require.NotContains(t, err.Error(), pw)
	require.True(t, redis.HasErrorPrefix(err, "unknown command"), "%v", err)
	var re redis.Error
	require.ErrorAs(t, err, &re)
	require.NotContains(t, re.Error(), pw)
}

// TestRedisUsesServerTime: processes whose local clocks disagree by an hour
// still share one timeline, because the script reads the server's clock.
func TestRedisUsesServerTime(t *testing.T) {
	srv := redistest.StartServer(t)
	prefix := redistest.KeyPrefix(t)
	rules, err := ParseRules("*=3/10s")
	require.NoError(t, err)
	var ts []*Throttler
	for _, skew := range []time.Duration{0, time.Hour, -time.Hour} {
		s, err := NewRedisStore(srv.Client(t), WithKeyPrefix(prefix))
		require.NoError(t, err)
		ageData(t, srv.Client(t), s)
		// A store timeout well above a loaded machine's round trip: the
		// test is of the clocks, not of the fallback.
		tr, err := New(rules, WithStore(s), WithStoreTimeout(time.Second), withClock(func() time.Time { return time.Now().Add(skew) }))
		require.NoError(t, err)
		t.Cleanup(func() { tr.Close() })
		ts = append(ts, tr)
	}
	ctx := context.Background()
	for _, tr := range ts {
		d, err := tr.Allow(ctx, "example.com")
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	for _, tr := range ts {
		d, err := tr.Allow(ctx, "example.com")
		require.NoError(t, err)
		require.False(t, d.Allowed)
		require.InDelta(t, 10*time.Second+DefaultMargin, d.RetryAfter, float64(time.Second))
	}
}

func TestRedisStoreNeedsContextTimeouts(t *testing.T) {
	srv := redistest.StartServer(t)
	plain := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer plain.Close()
	_, err := NewRedisStore(plain)
	require.ErrorContains(t, err, "ContextTimeoutEnabled")
}

// TestSharedStoreKeepsEntriesApart: two Throttlers on one store (one
// process id) never name two entries alike.
func TestSharedStoreKeepsEntriesApart(t *testing.T) {
	client := redistest.StartServer(t).Client(t)
	s, err := NewRedisStore(client, WithKeyPrefix(redistest.KeyPrefix(t)))
	require.NoError(t, err)
	ageData(t, client, s)
	rules, err := ParseRules("*=2/10s")
	require.NoError(t, err)
	var got []bool
	for range 3 {
		tr, err := New(rules, WithStore(s), WithStoreTimeout(time.Second))
		require.NoError(t, err)
		d, err := tr.Allow(context.Background(), "example.com")
		require.NoError(t, err)
		got = append(got, d.Allowed)
		tr.Close()
	}
	require.Equal(t, []bool{true, true, false}, got)
}

// TestAYoungStoreHoldsTargetsFoundEmpty: a store whose data began less
// than a horizon and a window ago may have lost logs that a newcomer never
// saw (Redis restarted empty, or was flushed), so it holds every target it
// finds empty until then: every slot booked before the loss lay at most a
// horizon ahead; a restore that finds the target new holds it too. The
// epoch is set when first needed, kept, and renewed when half its TTL is
// gone.
func TestAYoungStoreHoldsTargetsFoundEmpty(t *testing.T) {
	s, client := startStore(t)
	require.NoError(t, client.Del(context.Background(), s.epochArg.(string)).Err()) // a new store
	clock := newFakeClock()
	s.now, s.readEpoch = clock.us.Load, true
	ctx := context.Background()
	start := clock.us.Load()
	epoch := func() (at, expires int64, ttl time.Duration) {
		t.Helper()
		v, err := client.Get(ctx, s.epochArg.(string)).Bytes()
		require.NoError(t, err)
		require.Len(t, v, 16)
		ttl, err = client.PTTL(ctx, s.epochArg.(string)).Result()
		require.NoError(t, err)
		return int64(binary.BigEndian.Uint64(v)), int64(binary.BigEndian.Uint64(v[8:])), ttl
	}
	reserve := func(target string, lim Limit, maxWait time.Duration) (Grant, State) {
		t.Helper()
		g := make([]Grant, 1)
		st, err := s.Reserve(ctx, target, lim, []Request{{ID: nextID(), N: 1, MaxWait: maxWait}}, g)
		require.NoError(t, err)
		return g[0], st
	}
	lim := Limit{Limit: 5, Window: time.Second}

	g, st := reserve("a.example", lim, -1)
	require.True(t, g.OK)
	require.Equal(t, 2*time.Second, g.Delay, "held for a horizon (a window by default) and a window")
	require.Equal(t, 2*time.Second, st.Paused)
	require.True(t, st.Young, "the pause is the young store's hold")
	require.Zero(t, st.Remaining)
	at, expires, ttl := epoch()
	require.Equal(t, start, at, "the data began at the first call")
	require.Equal(t, start+(24*time.Hour).Microseconds(), expires)
	require.InDelta(t, 24*time.Hour, ttl, float64(time.Second))

	clock.Advance(500 * time.Millisecond)
	g, st = reserve("b.example", lim, 0)
	require.False(t, g.OK, "a decision that does not wait is refused")
	require.Equal(t, 1500*time.Millisecond, g.Delay)
	require.True(t, st.Young)
	g, st = reserve("a.example", lim, -1)
	require.Equal(t, 1500*time.Millisecond, g.Delay, "a target with entries keeps the hold in meta")
	require.True(t, st.Young, "the hold an earlier call wrote is still the young store's")
	// Entries a process restores (leaving its fallback) must not hide the
	// lost log: the restore holds the target too.
	require.NoError(t, s.Restore(ctx, "r.example", lim.Window, []Entry{{ID: nextID(), N: 1}}))
	g, _ = reserve("r.example", lim, -1)
	require.Equal(t, 1500*time.Millisecond, g.Delay, "restored entries keep the hold")
	// So when a pause (a 429's, or one written back) made meta first.
	_, err := s.Pause(ctx, "p.example", 100*time.Millisecond)
	require.NoError(t, err)
	require.NoError(t, s.Restore(ctx, "p.example", lim.Window, []Entry{{ID: nextID(), N: 1}}))
	g, _ = reserve("p.example", lim, -1)
	require.Equal(t, 1500*time.Millisecond, g.Delay, "restored entries after a pause keep the hold")
	_, err = s.Pause(ctx, "a.example", 3*time.Second) // a 429's, longer
	require.NoError(t, err)
	g, st = reserve("a.example", lim, -1)
	require.Equal(t, 3*time.Second, g.Delay)
	require.False(t, st.Young, "a pause like any other")
	g, _ = reserve("c.example", Limit{Limit: 5, Window: time.Second, Ahead: 3 * time.Second}, -1)
	require.Equal(t, 3500*time.Millisecond, g.Delay, "a longer horizon holds longer")
	require.NoError(t, s.Restore(ctx, "q.example", lim.Window, []Entry{{ID: nextID(), N: 1}}))
	g, _ = reserve("q.example", lim, -1)
	require.Equal(t, 3500*time.Millisecond, g.Delay, "a restore to a target this process never booked takes its latest horizon")

	clock.Advance(1500 * time.Millisecond)
	g, st = reserve("d.example", lim, 0)
	require.True(t, g.OK, "the data is old enough")
	require.Zero(t, g.Delay)
	require.False(t, st.Young)
	at, _, _ = epoch()
	require.Equal(t, start, at, "the epoch is kept")

	clock.Advance(13 * time.Hour) // less than half the TTL is left
	g, _ = reserve("e.example", lim, 0)
	require.True(t, g.OK)
	at, expires, _ = epoch()
	require.Equal(t, start, at, "a renewal keeps the epoch")
	require.Equal(t, clock.us.Load()+(24*time.Hour).Microseconds(), expires, "and moves its expiry")

	// A mark on a target in use keeps the key; one that is gone stays
	// gone (a release before the key writes logs without it), and the
	// next target found empty makes it anew, young.
	busy := Limit{Limit: 5, Window: 24 * time.Hour} // its log is not empty below
	g, _ = reserve("m.example", busy, -1)
	require.True(t, g.OK)
	clock.Advance(13 * time.Hour)
	s.target("m.example").marked.Store(0) // a mark is due
	g, _ = reserve("m.example", busy, -1)
	require.True(t, g.OK)
	_, expires, _ = epoch()
	require.Equal(t, clock.us.Load()+(24*time.Hour).Microseconds(), expires, "a mark renews the key")
	require.NoError(t, client.Del(ctx, s.epochArg.(string)).Err()) // it expired, or a loss took it
	s.target("m.example").marked.Store(0)
	g, _ = reserve("m.example", busy, -1)
	require.True(t, g.OK)
	n, err := client.Exists(ctx, s.epochArg.(string)).Result()
	require.NoError(t, err)
	require.Zero(t, n, "a mark does not make the key")
	g, st = reserve("n.example", lim, 0)
	require.False(t, g.OK, "the next target found empty is held")
	require.True(t, st.Young)
	at, _, _ = epoch()
	require.Equal(t, clock.us.Load(), at)
}

// TestAClusterStoreKeepsEverySlotsEpoch: on a Cluster the store makes the
// epoch key of every slot at its first decision, each with a TTL of a day,
// so that a target of a slot no decision read yet is not held as if the
// data were young long after it began; Close stops that upkeep.
func TestAClusterStoreKeepsEverySlotsEpoch(t *testing.T) {
	client := redistest.StartCluster(t).Client(t)
	pipes := &pipelineSizes{}
	client.AddHook(pipes)
	ctx := context.Background()
	prefix := redistest.KeyPrefix(t)
	s, err := NewRedisStore(client, WithKeyPrefix(prefix))
	require.NoError(t, err)
	_, err = s.Reserve(ctx, "a.example", Limit{Limit: 1, Window: time.Second}, []Request{{ID: 1, N: 1}}, make([]Grant, 1))
	require.NoError(t, err)
	count := func() int {
		var n atomic.Int64
		require.NoError(t, client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			keys, err := m.Keys(ctx, prefix+"{~*}:epoch").Result()
			n.Add(int64(len(keys)))
			return err
		}))
		return int(n.Load())
	}
	require.Eventually(t, func() bool { return count() == slots }, 20*time.Second, 50*time.Millisecond, "every slot's epoch")
	// The pass went in paced chunks, not in one pipeline that would hold
	// every node while the first decisions wait behind it.
	n, largest := pipes.get()
	require.GreaterOrEqual(t, n, slots/epochChunk, "pipelines of the pass")
	require.LessOrEqual(t, largest, epochChunk, "commands in a pipeline of the pass")
	// A second pass, over keys that are fresh (as another process's pass
	// leaves them), asks their TTLs and runs no script.
	before := pipes.scriptRuns()
	require.Empty(t, s.renewEpochsPaced(ctx, s.slotEpochKeys()), "keys the pass failed on")
	require.Equal(t, before, pipes.scriptRuns(), "script runs of a pass over fresh keys")
	for _, target := range []string{"b.example", "c.example", "10.0.0.1"} {
		ttl, err := client.PTTL(ctx, s.epochKey(target)).Result()
		require.NoError(t, err)
		require.Greater(t, ttl, 23*time.Hour, target)
		require.LessOrEqual(t, ttl, 24*time.Hour, target)
	}
	require.NoError(t, s.Close())
	select {
	case <-s.keeperRun:
	default:
		t.Fatal("Close returned before the upkeep stopped")
	}
	require.NoError(t, s.Close(), "a second Close")

	// After a SCRIPT FLUSH (or a restart) a pass loads the script again,
	// node by node, and makes every key.
	require.NoError(t, client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		if err := m.ScriptFlush(ctx).Err(); err != nil {
			return err
		}
		keys, err := m.Keys(ctx, prefix+"{~*}:epoch").Result()
		if err != nil || len(keys) == 0 {
			return err
		}
		for _, k := range keys {
			if err := m.Del(ctx, k).Err(); err != nil {
				return err
			}
		}
		return nil
	}))
	require.Zero(t, count())
	require.Empty(t, s.renewEpochs(ctx, s.slotEpochKeys()), "keys the pass failed on")
	require.Equal(t, slots, count())
}

// pipelineSizes is a go-redis hook that counts pipelines and the script
// runs in them, and keeps the largest one's length.
type pipelineSizes struct {
	mu                  sync.Mutex
	n, largest, scripts int
}

func (p *pipelineSizes) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (p *pipelineSizes) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (p *pipelineSizes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		p.mu.Lock()
		p.n, p.largest = p.n+1, max(p.largest, len(cmds))
		for _, c := range cmds {
			if name := strings.ToLower(c.Name()); name == "evalsha" || name == "eval" {
				p.scripts++
			}
		}
		p.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (p *pipelineSizes) get() (n, largest int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n, p.largest
}

func (p *pipelineSizes) scriptRuns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.scripts
}

// TestCloseDoesNotWaitOnAHungNode: a node that takes the connection and
// never answers holds the epoch upkeep's pass; Close returns within a
// second anyway.
func TestCloseDoesNotWaitOnAHungNode(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	client := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	s, err := NewRedisStore(client)
	require.NoError(t, err)
	s.batch.Store(false) // as after CROSSSLOT: it keeps every slot's epoch
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = s.Reserve(ctx, "a.example", Limit{Limit: 1, Window: time.Second}, []Request{{ID: 1, N: 1}}, make([]Grant, 1))
	require.Error(t, err)
	require.NotNil(t, s.keeperRun, "the upkeep started")
	start := time.Now()
	require.NoError(t, s.Close())
	require.Less(t, time.Since(start), 1500*time.Millisecond)
}

// TestLostLogHoldsTheTarget: Redis loses the log between two calls, so no
// call fails, and keeps its epoch (a failover to a replica that missed the
// latest writes, say): the next call sees an empty log where this process
// saw entries still inside the window, and holds the target for a window
// after the last of them instead of admitting a second full window.
func TestLostLogHoldsTheTarget(t *testing.T) {
	srv := redistest.StartServer(t)
	client := srv.Client(t)
	prefix := redistest.KeyPrefix(t)
	s, err := NewRedisStore(client, WithKeyPrefix(prefix))
	require.NoError(t, err)
	ageData(t, client, s)
	rules, err := ParseRules("*=5/10s")
	require.NoError(t, err)
	logs := &logRecorder{}
	tr, err := New(rules, WithStore(s), WithStoreTimeout(time.Second), WithLogger(slog.New(logs)))
	require.NoError(t, err)
	defer tr.Close()
	ctx := context.Background()
	for range 5 {
		d, err := tr.Allow(ctx, "example.com")
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	srv.Kill(t)
	srv.Restart(t)
	ageData(t, client, s) // the epoch survived
	var d Decision
	require.Eventually(t, func() bool {
		d, err = tr.Allow(ctx, "example.com")
		return err == nil && tr.Mode() == ModeStore
	}, 5*time.Second, 20*time.Millisecond)
	require.False(t, d.Allowed, "a lost log counts as full")
	// Until a window after every slot the fleet may have booked before the
	// loss: the horizon (a window and the margin) and a window.
	require.InDelta(t, 20100*time.Millisecond, d.RetryAfter, float64(time.Second))
	require.Equal(t, 1, logs.count("Redis lost bookings this process had seen"), "the hold is logged once: %q", logs.msgs)
	ttl, err := client.PTTL(ctx, s.keys("example.com")[2]).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, time.Duration(0), "the heartbeat made anew after the restart has a TTL")
}

// replicaOf takes what a replica has of keys now (it fails the test if
// none exists), and returns the failover to it: each key is replaced by
// that copy, or deleted if it had none, as if Redis promoted a replica
// that lacked every write made since.
func replicaOf(t *testing.T, client *redis.Client, keys []string) (failover func()) {
	t.Helper()
	ctx := context.Background()
	snap := map[string]string{}
	for _, k := range keys {
		if v, err := client.Dump(ctx, k).Result(); err == nil {
			snap[k] = v
		}
	}
	require.NotEmpty(t, snap, "a replica has something of %v", keys)
	return func() {
		t.Helper()
		for _, k := range keys {
			require.NoError(t, client.Del(ctx, k).Err())
			if v, ok := snap[k]; ok {
				require.NoError(t, client.Restore(ctx, k, 0, v).Err())
			}
		}
	}
}

// TestLostLatestWritesHoldTheTarget: Redis that lost a log's latest
// entries but not the log (a replica promoted before it had them) is
// noticed by a process that saw one of them, whatever the entries left:
// the target is held until a window after every slot booked before the
// loss, as for a lost log. A cancel of the latest entries is not a loss.
func TestLostLatestWritesHoldTheTarget(t *testing.T) {
	for _, tc := range []struct{ listLogs, cancelFirst bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		listLogs := tc.listLogs
		t.Run(fmt.Sprintf("list logs %v, a cancel first %v", listLogs, tc.cancelFirst), func(t *testing.T) {
			client := redistest.StartServer(t).Client(t)
			opts := []RedisOption{WithKeyPrefix(redistest.KeyPrefix(t))}
			if listLogs {
				opts = append(opts, WithListLogs())
			}
			s, err := NewRedisStore(client, opts...)
			require.NoError(t, err)
			clock := newFakeClock()
			s.now = clock.us.Load // and the data is old
			ctx := context.Background()
			lim := Limit{Limit: 10, Window: time.Second}
			var st State
			book := func(target string, id uint64, maxWait time.Duration) Grant {
				t.Helper()
				g := make([]Grant, 1)
				st, err = s.Reserve(ctx, target, lim, []Request{{ID: id, N: 1, MaxWait: maxWait}}, g)
				require.NoError(t, err)
				return g[0]
			}
			keys := s.keys("a.example")
			for i := range 3 {
				require.True(t, book("a.example", uint64(i+1), -1).OK)
			}
			// What a replica had: the log with three entries.
			failover := replicaOf(t, client, keys[:2])
			clock.Advance(100 * time.Millisecond)
			require.True(t, book("a.example", 4, -1).OK) // written to the old master only
			failover()
			clock.Advance(100 * time.Millisecond)
			if tc.cancelFirst {
				// A waiter of this process gives its surviving slot back
				// before the next booking: that tells nothing of the loss.
				require.NoError(t, s.Cancel(ctx, "a.example", 1, 1))
			}
			g := book("a.example", 5, 0)
			require.False(t, g.OK, "entries left, but the one this process saw last is gone")
			require.Equal(t, 2*time.Second, g.Delay, "held for a horizon (a window by default) and a window")
			require.True(t, st.Lost, "the call that noticed says so")
			require.False(t, st.Young)
			clock.Advance(100 * time.Millisecond)
			g = book("a.example", 6, 0)
			require.Equal(t, 1900*time.Millisecond, g.Delay, "refusals do not push the hold on")
			require.False(t, st.Lost, "noticed once")

			// A cancel of the latest entry, others left, is not a loss.
			for i := range 3 {
				require.True(t, book("b.example", uint64(10+i), -1).OK)
			}
			require.NoError(t, s.Cancel(ctx, "b.example", 12, 1))
			g = book("b.example", 13, 0)
			require.True(t, g.OK, "granted at once")
			require.False(t, st.Lost)
		})
	}
}

func TestSharedPlaceholdersCountOnce(t *testing.T) {
	client := redistest.StartServer(t).Client(t)
	prefix := redistest.KeyPrefix(t)
	ctx := context.Background()
	var entries []Entry
	for i := range 3 {
		entries = append(entries, Entry{ID: SharedEntry | uint64(i+1), N: 1, Age: -time.Second})
	}
	for range 2 { // two processes come back and restore the same placeholders
		s, err := NewRedisStore(client, WithKeyPrefix(prefix))
		require.NoError(t, err)
		require.NoError(t, s.Restore(ctx, "example.com", 10*time.Second, append(entries, Entry{ID: nextID(), N: 1, Age: time.Second})))
	}
	s, err := NewRedisStore(client, WithKeyPrefix(prefix))
	require.NoError(t, err)
	require.Len(t, logOf(t, client, s, "example.com"), 3+2, "3 shared placeholders once, and each process's own entry")
}

// TestRedisStoreUpgradesASortedSetLog: a log left as a sorted set by an
// earlier fleetgate (member, score = slot) and a bare pause are read as
// they were: the first reserve rewrites the log as a list with its entries
// and its TTL, counts them, and honours the pause; a cancel does the same.
func TestRedisStoreUpgradesASortedSetLog(t *testing.T) {
	const now = int64(1_800_000_000_000_000)
	s, client := fixedClockStore(t, now)
	ctx := context.Background()
	keys := s.keys("old.example")
	old := []redis.Z{{Score: float64(now - 500_000), Member: "p.1"}, {Score: float64(now - 200_000), Member: "p.2"}}
	require.NoError(t, client.ZAdd(ctx, keys[0], old...).Err())
	require.NoError(t, client.PExpire(ctx, keys[0], time.Minute).Err())

	g := make([]Grant, 2)
	st, err := s.Reserve(ctx, "old.example", Limit{Limit: 3, Window: time.Second}, []Request{{ID: 1, N: 1, MaxWait: -1}, {ID: 2, N: 1, MaxWait: -1}}, g)
	require.NoError(t, err)
	require.Equal(t, []Grant{{OK: true}, {OK: true, Delay: 500 * time.Millisecond}}, g, "the old entries count")
	require.Equal(t, 0, st.Remaining)
	typ, err := client.Type(ctx, keys[0]).Result()
	require.NoError(t, err)
	require.Equal(t, "list", typ)
	n, err := client.LLen(ctx, keys[0]).Result()
	require.NoError(t, err)
	require.Equal(t, int64(4), n)

	// A bare pause, as an earlier fleetgate wrote it to the same key, holds
	// the target.
	require.Equal(t, s.prefix+"{old.example}:pause", keys[1])
	require.NoError(t, client.Set(ctx, keys[1], fmt.Sprint(now+3_000_000), time.Minute).Err())
	st, err = s.Reserve(ctx, "old.example", Limit{Limit: 3, Window: time.Second}, []Request{{ID: 3, N: 1, MaxWait: -1}}, g)
	require.NoError(t, err)
	require.Equal(t, 3*time.Second, st.Paused)

	other := s.keys("other.example")
	require.NoError(t, client.ZAdd(ctx, other[0], redis.Z{Score: float64(now + 100_000), Member: s.member(9)}).Err())
	require.NoError(t, client.PExpire(ctx, other[0], time.Minute).Err())
	require.NoError(t, s.Cancel(ctx, "other.example", 9, 1))
	n, err = client.LLen(ctx, other[0]).Result()
	require.NoError(t, err)
	require.Zero(t, n, "the cancel found its entry in the rewritten log")
}

// TestRedisStoreUpgradesADecimalLog: a log an earlier fleetgate kept as a
// list of decimal slots, and its "<pause>:<live>:<cancelled>" meta, are
// read as they were: the first reserve rewrites the log with its entries
// and its TTL, counts them, and honours the pause; a cancel (with or
// without members) or a restore that is the first to read such a log
// rewrites it too.
func TestRedisStoreUpgradesADecimalLog(t *testing.T) {
	const now = int64(1_800_000_000_000_000)
	s, client := fixedClockStore(t, now)
	ctx := context.Background()
	keys := s.keys("old.example")
	decimal := func(slot int64, member string) string { return fmt.Sprintf("%016d", slot) + member }
	require.NoError(t, client.RPush(ctx, keys[0], decimal(now-500_000, "p.1"), decimal(now-200_000, "p.2")).Err())
	require.NoError(t, client.PExpire(ctx, keys[0], time.Minute).Err())
	require.NoError(t, client.Set(ctx, keys[1], fmt.Sprintf("%d:4:0", now+300_000), time.Minute).Err())

	g := make([]Grant, 2)
	st, err := s.Reserve(ctx, "old.example", Limit{Limit: 3, Window: time.Second}, []Request{{ID: 1, N: 1, MaxWait: -1}, {ID: 2, N: 1, MaxWait: -1}}, g)
	require.NoError(t, err)
	require.Equal(t, []Grant{{OK: true, Delay: 300 * time.Millisecond}, {OK: true, Delay: 500 * time.Millisecond}}, g, "the pause holds and the old entries count")
	require.Equal(t, 300*time.Millisecond, st.Paused)
	es, err := client.LRange(ctx, keys[0], 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{logEntry(now-500_000, "p.1"), logEntry(now-200_000, "p.2"), logEntry(now+300_000, s.member(1)), logEntry(now+500_000, s.member(2))}, es)

	// A refusal writes nothing: the rewritten log keeps its TTL.
	other := s.keys("other.example")
	require.NoError(t, client.RPush(ctx, other[0], decimal(now+100_000, s.member(9))).Err())
	require.NoError(t, client.PExpire(ctx, other[0], time.Minute).Err())
	_, err = s.Reserve(ctx, "other.example", Limit{Limit: 1, Window: time.Second}, []Request{{ID: 10, N: 1, MaxWait: 0}}, g[:1])
	require.NoError(t, err)
	require.Equal(t, Grant{Delay: 1100 * time.Millisecond}, g[0], "the old entry counts")
	es, err = client.LRange(ctx, other[0], 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{logEntry(now+100_000, s.member(9))}, es)
	ttl, err := client.PTTL(ctx, other[0]).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, 50*time.Second, "the rewrite keeps the TTL")
	require.NoError(t, s.Cancel(ctx, "other.example", 9, 1))
	n, err := client.LLen(ctx, other[0]).Result()
	require.NoError(t, err)
	require.Zero(t, n, "the cancel found its entry in the rewritten log")

	// A cancel is the first to read a decimal log.
	third := s.keys("third.example")
	require.NoError(t, client.RPush(ctx, third[0], decimal(now+100_000, "p.1"), decimal(now+200_000, s.member(11))).Err())
	require.NoError(t, client.PExpire(ctx, third[0], time.Minute).Err())
	require.NoError(t, s.Cancel(ctx, "third.example", 11, 1))
	es, err = client.LRange(ctx, third[0], 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{logEntry(now+100_000, "p.1")}, es)

	// So is a cancel of no member, which reports the log's last slot.
	fourth := s.keys("fourth.example")
	require.NoError(t, client.RPush(ctx, fourth[0], decimal(now+100_000, "p.1")).Err())
	args := append(append(scriptArgs(3, 6), s.target("fourth.example").keyArgs...), s.op("cancel"), int64(1_000_000))
	vals, err := s.eval(ctx, slidingLog, args, 3)
	require.NoError(t, err)
	require.Equal(t, []int64{now, 0, now + 100_000}, vals)

	// And a restore.
	fifth := s.keys("fifth.example")
	require.NoError(t, client.RPush(ctx, fifth[0], decimal(now-100_000, "p.1")).Err())
	require.NoError(t, s.Restore(ctx, "fifth.example", time.Second, []Entry{{ID: 12, N: 1, Age: 0}}))
	es, err = client.LRange(ctx, fifth[0], 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{logEntry(now-100_000, "p.1"), logEntry(now, s.member(12))}, es)
}

// TestAnEarlierReleasesLongLogIsUpgradedWhenReadFromItsEnd: a log an
// earlier fleetgate left, a list of decimal slots or a sorted set, long
// enough that a reserve reads its length and last entry first, is
// upgraded and decided as the list it becomes.
func TestAnEarlierReleasesLongLogIsUpgradedWhenReadFromItsEnd(t *testing.T) {
	const now = int64(1_800_000_000_000_000)
	s, client := fixedClockStore(t, now)
	ctx := context.Background()
	lim := Limit{Limit: 7, Window: time.Second}
	k := s.keys("decimal.example")
	for i := range 6 {
		require.NoError(t, client.RPush(ctx, k[0], fmt.Sprintf("%016d", now-int64(6-i)*1000)+fmt.Sprintf("p.%d", i)).Err())
	}
	g := make([]Grant, 1)
	st, err := s.Reserve(ctx, "decimal.example", lim, []Request{{ID: 1, N: 1, MaxWait: -1}}, g)
	require.NoError(t, err)
	require.Equal(t, Grant{OK: true}, g[0])
	require.Equal(t, 0, st.Remaining)
	es, err := client.LRange(ctx, k[0], 0, -1).Result()
	require.NoError(t, err)
	require.Len(t, es, 7)
	require.Equal(t, logEntry(now-6000, "p.0"), es[0])

	z := s.keys("zset.example")
	for i := range 6 {
		require.NoError(t, client.ZAdd(ctx, z[0], redis.Z{Score: float64(now - int64(6-i)*1000), Member: fmt.Sprintf("p.%d", i)}).Err())
	}
	st, err = s.Reserve(ctx, "zset.example", lim, []Request{{ID: 2, N: 1, MaxWait: -1}}, g)
	require.NoError(t, err)
	require.Equal(t, Grant{OK: true}, g[0])
	require.Equal(t, 0, st.Remaining)
	es, err = client.LRange(ctx, z[0], 0, -1).Result()
	require.NoError(t, err)
	require.Len(t, es, 7)
	require.Equal(t, logEntry(now-6000, "p.0"), es[0])
}

// TestReserveRejectsBadNumbers: a reserve whose block of numbers is too
// short, does not match its count of requests, holds an impossible limit,
// horizon, liveness or process id, lacks a request's member or carries one
// more, or whose keys
// are not three per target and the epoch's is an error that says so, and
// writes nothing, with its op named or without one.
func TestReserveRejectsBadNumbers(t *testing.T) {
	s, client := startStore(t)
	ctx := context.Background()
	keys := append(s.target("x.example").keyArgs, s.epochArg)
	pid := s.procNum
	good := appendNums(nil, 5, 1_000_000, 0, 0, -10_000_000, 0, 0, 1, pid, 1, -1)
	// args makes a reserve's arguments: keys, the op when named, then rest.
	args := func(keys []any, named bool, rest ...any) []any {
		a := append(scriptArgs(len(keys), len(keys)+1+len(rest)), keys...)
		if named {
			a = append(a, "reserve")
		}
		return append(a, rest...)
	}
	for _, named := range []bool{false, true} {
		for name, nums := range map[string][]byte{
			"short":                good[:64],
			"count too high":       appendNums(good[:56:56], 2, pid, 1, -1),
			"count too low":        appendNums(good, 1, -1),
			"negative count":       appendNums(good[:56:56], -1, pid),
			"limit 0":              appendNums(nil, 0, 1_000_000, 0, 0, -10_000_000, 0, 0, 1, pid, 1, -1),
			"negative ahead":       appendNums(nil, 5, 1_000_000, 0, -1, -10_000_000, 0, 0, 1, pid, 1, -1),
			"liveness 0":           appendNums(nil, 5, 1_000_000, 0, 0, 0, 0, 0, 1, pid, 1, -1),
			"negative process id":  appendNums(good[:64:64], -1, 1, -1),
			"process id too large": appendNums(good[:64:64], 1<<48, 1, -1),
			"no member":            nil,
		} {
			a := args(keys, named, nums, "m.1")
			if nums == nil {
				a = args(keys, named, good)
			}
			_, err := s.eval(ctx, slidingLog, a, 1)
			require.ErrorContains(t, err, "bad reserve arguments", "%s, named %v", name, named)
		}
		_, err := s.eval(ctx, slidingLog, args(keys, named, good, "m.1", "m.2"), 1)
		require.ErrorContains(t, err, "bad reserve arguments", "a member past the block's requests, named %v", named)
		_, err = s.eval(ctx, slidingLog, args(keys[:3], named, good, "m.1"), 1)
		require.ErrorContains(t, err, "bad reserve keys", "no epoch key, named %v", named)
	}
	_, err := s.eval(ctx, slidingLog, args(keys, false, good, "m.1"), 1)
	require.NoError(t, err, "the good block, which the cases spoil")
	require.NoError(t, client.Del(ctx, s.keys("x.example")...).Err())
	_, err = s.eval(ctx, slidingLog, args(keys[:3], false, good, "m.1"), 1)
	require.ErrorContains(t, err, "bad reserve keys", "no epoch key")
	n, err := client.Exists(ctx, s.keys("x.example")...).Result()
	require.NoError(t, err)
	require.Zero(t, n, "nothing was written")
}

// TestRestoreRejectsBadArguments: a restore whose last member lacks its
// age, or with an age that is no number, is an error that says so, and
// writes nothing (not even the cut of the log's dead entries).
func TestRestoreRejectsBadArguments(t *testing.T) {
	s, client := startStore(t)
	ctx := context.Background()
	keys := append(s.target("x.example").keyArgs, s.epochArg)
	now := time.Now().UnixMicro()
	require.NoError(t, client.RPush(ctx, s.keys("x.example")[0], logEntry(now-5_000_000, "dead.1")).Err())
	for name, pairs := range map[string][]any{
		"a member without its age": {"p.1", int64(0), "p.2"},
		"an age that is no number": {"p.1", "soon"},
	} {
		a := append(append(scriptArgs(len(keys), len(keys)+3+len(pairs)), keys...), s.op("restore"), int64(1_000_000), int64(0))
		_, err := s.eval(ctx, slidingLog, append(a, pairs...), 1)
		require.ErrorContains(t, err, "bad restore arguments", name)
	}
	es, err := client.LRange(ctx, s.keys("x.example")[0], 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{logEntry(now-5_000_000, "dead.1")}, es, "nothing was written")
}

// TestARestoredHoldOutlivesMeta: a restore onto an empty log while the
// store's data is young holds the target (reserve's hold: the epoch, the
// horizon and a window), so that restored entries do not hide a lost
// log. Meta, which carries that hold, lasts as long: kept with its TTL (a
// short pause made it) it expired first and took the hold with it, and
// the next reserve was granted at once. With the log in the list
// (WithListLogs, or more entries than fit inline) and inline.
func TestARestoredHoldOutlivesMeta(t *testing.T) {
	client := redistest.StartServer(t).Client(t)
	ctx := context.Background()
	const window = 2 * time.Second
	for name, c := range map[string]struct {
		inlineMax string
		entries   int
	}{
		"list logs": {"0", 1},
		"inline logs, more entries than fit inline": {"", 65},
		"inline logs, a few entries":                {"", 3},
	} {
		t.Run(name, func(t *testing.T) {
			s, err := NewRedisStore(client, WithKeyPrefix(redistest.KeyPrefix(t)))
			require.NoError(t, err)
			s.inlineMax = c.inlineMax
			// A short pause makes meta, with a TTL of about the liveness.
			s.liveness = 200 * time.Millisecond
			_, err = s.Pause(ctx, "x.example", 100*time.Millisecond)
			require.NoError(t, err)
			var es []Entry
			for i := range c.entries {
				es = append(es, Entry{ID: uint64(100 + i), N: 1, Age: 0})
			}
			require.NoError(t, s.Restore(ctx, "x.example", window, es))
			pttl, err := client.PTTL(ctx, s.keys("x.example")[1]).Result()
			require.NoError(t, err)
			require.Greater(t, pttl, 2*window-time.Second, "meta lasts until the hold (a horizon and a window) ends")
			time.Sleep(300 * time.Millisecond) // past the TTL the pause gave meta
			g := make([]Grant, 1)
			_, err = s.Reserve(ctx, "x.example", Limit{Limit: 1000, Window: window}, oneUnit(), g)
			require.NoError(t, err)
			require.Greater(t, g[0].Delay, window, "the young store's hold still holds the target")
		})
	}
}

// TestAReserveWithoutAnOpTakesAnyLimit: a reserve without an op starts
// with its first block's numbers, which the script tells from an op name
// by their first byte, the limit's highest. A limit of 2^56 or more (a
// Store caller's; the Throttler's rules stop at 100,000) is decided as
// any other, alone and first in a shared run, as the memory store and a
// named op decide it.
func TestAReserveWithoutAnOpTakesAnyLimit(t *testing.T) {
	ctx := context.Background()
	huge, small := Limit{Limit: 1 << 56, Window: time.Second}, Limit{Limit: 5, Window: time.Second}
	s, _ := startStore(t)
	require.False(t, s.namedOps(), "the store sends no op")
	g := make([]Grant, 1)
	_, err := s.Reserve(ctx, "huge.example", huge, oneUnit(), g)
	require.NoError(t, err)
	require.True(t, g[0].OK)
	call := func(tgt string, lim Limit) *reserveCall {
		return &reserveCall{ctx: ctx, rt: s.target(tgt), target: tgt, lim: lim, reqs: oneUnit(), grants: make([]Grant, 1)}
	}
	run := []*reserveCall{call("huge2.example", Limit{Limit: 1<<62 - 1, Window: time.Second}), call("small.example", small)}
	s.reserve(run)
	for i, c := range run {
		require.NoError(t, c.err, "call %d of a run led by a huge limit", i)
		require.True(t, c.grants[0].OK, "call %d", i)
	}
}

// TestEachBlockMarksTheProcessItCarries: a mark names the process by the
// id in its block's numbers, as 12 hex digits, whatever the other blocks
// of the run carry.
func TestEachBlockMarksTheProcessItCarries(t *testing.T) {
	s, client := startStore(t)
	ctx := context.Background()
	ka, kb := s.target("a.example").keyArgs, s.target("b.example").keyArgs
	keys := append(append(append([]any{}, ka...), kb...), s.epochArg)
	block := func(pid int64) []byte { // a mark (positive liveness), one request
		return appendNums(nil, 5, 1_000_000, 0, 0, 10_000_000, 0, 0, 1, pid, 1, -1)
	}
	pids := []int64{0x0000000a1b2c, 0xfedcba987654} // the second past 2^32 and 2^47
	args := append(append(scriptArgs(len(keys), len(keys)+4), keys...), block(pids[0]), "m.1", block(pids[1]), "m.2")
	_, err := s.eval(ctx, slidingLog, args, 1)
	require.NoError(t, err)
	for i, k := range []any{ka[2], kb[2]} {
		procs, err := client.ZRange(ctx, k.(string), 0, -1).Result()
		require.NoError(t, err)
		require.Equal(t, []string{fmt.Sprintf("%012x", pids[i])}, procs, "block %d", i+1)
	}
}

// TestScriptTakesATimeOnlyAfterAnAt: a test fixes the script's clock after
// an '@' in the op, and the script answers with that time; an op whose
// time it cannot read, or that it does not know, is an error that names
// the op and writes nothing.
func TestScriptTakesATimeOnlyAfterAnAt(t *testing.T) {
	s, client := startStore(t)
	ctx := context.Background()
	pause := func(target, op string) ([]int64, error) {
		args := append(append(scriptArgs(3, 3), s.target(target).keyArgs...), op, int64(1_000_000), int64(10_000_000))
		return s.eval(ctx, slidingLog, args, 2)
	}
	vals, err := pause("x.example", "pause@1700000000000000")
	require.NoError(t, err)
	require.Equal(t, []int64{1_700_000_000_000_000, 1_000_000, 0}, vals, "now, the pause, not a hold")
	pttl, err := client.PTTL(ctx, s.keys("x.example")[1]).Result()
	require.NoError(t, err)
	require.Positive(t, pttl, "a fixed time sets TTLs as the server clock would")

	vals, err = pause("x.example", "pause@1700000000000000/2#0") // every test form at once
	require.NoError(t, err)
	require.Equal(t, int64(1_700_000_000_000_000), vals[0])

	for op, msg := range map[string]string{
		"pause@17000x00": "bad op pause@17000x00",
		"pause#x1":       "bad op pause#x1",
		"pause/2#0@1":    "bad op pause/2#0@1",
		"pause17":        "bad op pause17",
		"pause@soon":     "unknown op pause@soon",
		"nap":            "unknown op nap",
		"":               "bad op",
	} {
		_, err = pause("y.example", op)
		require.ErrorContains(t, err, msg)
	}
	n, err := client.Exists(ctx, s.keys("y.example")...).Result()
	require.NoError(t, err)
	require.Zero(t, n, "nothing was written")
}

// TestForgetKeepsATargetWatchingForALostLog: a store forgets what it keeps
// for targets it has not used for a minute (and only those), except a
// target whose log it saw within a window: when Redis loses that log, the
// store still takes it for lost and holds the target as if the log had
// been full.
func TestForgetKeepsATargetWatchingForALostLog(t *testing.T) {
	s, client := startStore(t)
	ctx := context.Background()
	lim := Limit{Limit: 5, Window: 3 * time.Minute}
	reqs := make([]Request, 5)
	for i := range reqs {
		reqs[i] = Request{ID: nextID(), N: 1, MaxWait: -1}
	}
	g := make([]Grant, 5)
	_, err := s.Reserve(ctx, "kept.example", lim, reqs, g)
	require.NoError(t, err)
	_, err = s.Reserve(ctx, "gone.example", Limit{Limit: 5, Window: time.Second}, oneUnit(), g[:1])
	require.NoError(t, err)

	// A request it can never grant: nothing written, nothing seen.
	_, err = s.Reserve(ctx, "busy.example", Limit{Limit: 5, Window: time.Second}, []Request{{ID: nextID(), N: 6}}, g[:1])
	require.NoError(t, err)
	s.forget(time.Now().Add(30 * time.Second))
	_, busy := s.targets.Load("busy.example")
	require.True(t, busy, "used within a minute")

	s.forget(time.Now().Add(70 * time.Second)) // all idle for more than a minute
	_, busy = s.targets.Load("busy.example")
	require.False(t, busy, "idle, and it saw no log")
	_, kept := s.targets.Load("kept.example")
	require.True(t, kept, "its log was seen within a window")
	_, gone := s.targets.Load("gone.example")
	require.False(t, gone, "idle, and the latest slot it saw is more than a window old")

	require.NoError(t, client.Del(ctx, s.keys("kept.example")...).Err()) // Redis lost the log
	st, err := s.Reserve(ctx, "kept.example", lim, []Request{{ID: nextID(), N: 1, MaxWait: 0}}, g[:1])
	require.NoError(t, err)
	require.False(t, g[0].OK, "the lost log counts as full")
	require.Positive(t, st.Paused)
}

// TestRestoreMovesAMemberLater: restoring a member already in the log keeps
// one entry, at the later slot (placeholders restored by a process that
// comes back later reach further).
func TestRestoreMovesAMemberLater(t *testing.T) {
	const now = int64(1_800_000_000_000_000)
	s, client := fixedClockStore(t, now)
	ctx := context.Background()
	shared := SharedEntry | 1
	require.NoError(t, s.Restore(ctx, "x.example", 10*time.Second, []Entry{{ID: shared, N: 1, Age: -time.Second}, {ID: 5, N: 1, Age: 0}}))
	require.NoError(t, s.Restore(ctx, "x.example", 10*time.Second, []Entry{{ID: shared, N: 1, Age: -3 * time.Second}}))
	require.NoError(t, s.Restore(ctx, "x.example", 10*time.Second, []Entry{{ID: shared, N: 1, Age: -2 * time.Second}}))
	require.Equal(t, []string{logEntry(now, s.member(5)), logEntry(now+3_000_000, s.member(shared))}, logOf(t, client, s, "x.example"))
}

// TestRestoreCutsTheDeadFirst: a restored member whose entry in the log no
// longer counts gets one entry, not a second one beside the dead: the dead
// entries that lead the log go first, and a log of only dead entries goes
// whole.
func TestRestoreCutsTheDeadFirst(t *testing.T) {
	const now = int64(1_800_000_000_000_000)
	s, client := fixedClockStore(t, now)
	ctx := context.Background()
	shared := SharedEntry | 1
	for target, dead := range map[string][]string{
		"x.example": {logEntry(now-3_000_000, s.member(7)), logEntry(now-2_000_000, s.member(shared))},
		"y.example": {logEntry(now-2_000_000, s.member(shared)), logEntry(now-500_000, s.member(8))},
	} {
		require.NoError(t, client.RPush(ctx, s.keys(target)[0], dead).Err())
		require.NoError(t, s.Restore(ctx, target, time.Second, []Entry{{ID: shared, N: 1, Age: 0}}))
	}
	require.Equal(t, []string{logEntry(now, s.member(shared))}, logOf(t, client, s, "x.example"))
	require.Equal(t, []string{logEntry(now-500_000, s.member(8)), logEntry(now, s.member(shared))}, logOf(t, client, s, "y.example"))
}

// startStore returns a RedisStore on a server of its own, and a client of
// that server.
func startStore(t *testing.T) (*RedisStore, *redis.Client) {
	t.Helper()
	client := redistest.StartServer(t).Client(t)
	s, err := NewRedisStore(client, WithKeyPrefix(redistest.KeyPrefix(t)))
	require.NoError(t, err)
	ageData(t, client, s)
	return s, client
}

// ageData makes the data of s's store a day old, as if the store had long
// been in use: no target found empty is held for a young store's sake. On
// a single node one key does; on a Cluster (or a node in cluster mode) it
// takes one per slot, for the slots of targets.
func ageData(t testing.TB, client redis.UniversalClient, s *RedisStore, targets ...string) {
	t.Helper()
	ctx := context.Background()
	now, err := client.Time(ctx).Result()
	require.NoError(t, err)
	v := string(appendNums(nil, now.Add(-24*time.Hour).UnixMicro(), now.Add(24*time.Hour).UnixMicro()))
	keys := []string{s.epochArg.(string)}
	for _, target := range targets {
		keys = append(keys, s.epochKey(target))
	}
	for _, k := range keys {
		require.NoError(t, client.Set(ctx, k, v, 24*time.Hour).Err(), "age the store's data")
	}
}

// fixedClockStore is startStore with the store's clock standing at now
// (server µs).
func fixedClockStore(t *testing.T, now int64) (*RedisStore, *redis.Client) {
	t.Helper()
	s, client := startStore(t)
	s.now = func() int64 { return now }
	return s, client
}

// fakeClockStore starts a server and a RedisStore on it whose script time
// is the returned clock's.
func fakeClockStore(t *testing.T) (*RedisStore, *redis.Client, *fakeClock) {
	t.Helper()
	client := redistest.StartServer(t).Client(t)
	s, err := NewRedisStore(client, WithKeyPrefix(redistest.KeyPrefix(t)))
	require.NoError(t, err)
	clock := newFakeClock()
	s.now = clock.us.Load
	return s, client, clock
}

// TestALostBookingBelowACancelledOneIsNoticed: a slot booked after a
// cancel of the log's latest booking may lie below the cancelled slot (the
// cancelled request was of more units), which the script keeps so that a
// process that saw it does not take its absence for a loss. When Redis
// loses that booking (a failover to a replica that lacked it), the process
// that made it notices, whether it made the cancelled booking too or never
// saw it: only a loss takes away a booking of its own it did not cancel.
func TestALostBookingBelowACancelledOneIsNoticed(t *testing.T) {
	for _, tc := range []struct {
		name      string
		listLogs  bool
		cancelled string // who made and cancelled the later booking
	}{
		{"inline, cancelled by the same process", false, "same"},
		{"list, cancelled by the same process", true, "same"},
		{"inline, cancelled by a process it never saw", false, "other"},
		{"list, cancelled by a process it never saw", true, "other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := redistest.StartServer(t).Client(t)
			prefix := redistest.KeyPrefix(t)
			clock := newFakeClock()
			store := func() *RedisStore {
				opts := []RedisOption{WithKeyPrefix(prefix)}
				if tc.listLogs {
					opts = append(opts, WithListLogs())
				}
				s, err := NewRedisStore(client, opts...)
				require.NoError(t, err)
				s.now = clock.us.Load // and the data is old
				return s
			}
			p, q := store(), store()
			if tc.cancelled == "same" {
				q = p
			}
			ctx := context.Background()
			lim := Limit{Limit: 2, Window: time.Second}
			var st State
			var err error
			book := func(s *RedisStore, id uint64, n int, maxWait time.Duration) Grant {
				t.Helper()
				g := make([]Grant, 1)
				st, err = s.Reserve(ctx, "a.example", lim, []Request{{ID: id, N: n, MaxWait: maxWait}}, g)
				require.NoError(t, err)
				return g[0]
			}
			keys := p.keys("a.example")
			require.Equal(t, granted(0), book(q, 1, 1, -1))
			require.Equal(t, granted(time.Second), book(q, 2, 2, -1), "two units wait a window behind the first")
			clock.Advance(time.Millisecond)
			require.NoError(t, q.Cancel(ctx, "a.example", 2, 2))
			// What a replica had: the first booking and the cancel.
			failover := replicaOf(t, client, keys[:2])
			clock.Advance(99 * time.Millisecond)
			require.Equal(t, granted(0), book(p, 3, 1, -1), "the room the cancel gave back, at once") // written to the old master only
			failover()
			clock.Advance(100 * time.Millisecond)
			g := book(p, 4, 1, 0)
			require.False(t, g.OK, "the booking this process made and saw last is gone, and it did not cancel it")
			require.True(t, st.Lost, "the call that noticed says so")
		})
	}
}

// twoProcessesOnAFullLog returns two processes, p and q, sharing one Redis
// whose data is old, with p's log lines recorded in logs, after p was
// admitted twice to x.example, the limit of rule (two per window).
func twoProcessesOnAFullLog(t *testing.T, rule string) (client *redis.Client, p, q *Throttler, logs *logRecorder) {
	t.Helper()
	client, process := processesOnOneRedis(t, rule)
	p, q = process(), process()
	ageData(t, client, p.store.(*RedisStore))
	logs = &logRecorder{}
	p.cfg.logger = slog.New(logs)
	for range 2 {
		d, err := p.Allow(context.Background(), "x.example")
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	return client, p, q, logs
}

// TestALostBookingIsNotSentOn: a process about to send on a slot it booked
// asks the store (Reservation.Paused, as the transport does) whether the
// fleet is paused, and in the same call whether its booking is still in
// the log. Redis that failed over to a replica that lacked the booking
// has lost it, and another process has booked the same slot: the answer
// is a hold, for the lost bookings of every process, so the first gives
// its slot back instead of sending a request too many.
func TestALostBookingIsNotSentOn(t *testing.T) {
	client, p, q, logs := twoProcessesOnAFullLog(t, "*=2/1s")
	ctx := context.Background()
	failover := replicaOf(t, client, p.store.(*RedisStore).keys("x.example")[:2])
	r, err := p.ReserveN(ctx, "x.example", 1)
	require.NoError(t, err)
	require.Greater(t, r.Delay(), 500*time.Millisecond, "booked a window on")
	left, err := r.Paused(ctx)
	require.NoError(t, err)
	require.Zero(t, left, "the booking is there")

	failover()
	r2, err := q.ReserveN(ctx, "x.example", 1)
	require.NoError(t, err)
	require.InDelta(t, r.Delay(), r2.Delay(), float64(50*time.Millisecond), "q books the lost slot again")
	left, err = r.Paused(ctx)
	require.NoError(t, err)
	require.Greater(t, left, time.Second, "held for a horizon and a window")
	require.Equal(t, 1, logs.count("lost bookings"), "%q", logs.msgs)
	d, err := q.Allow(ctx, "x.example")
	require.NoError(t, err)
	require.False(t, d.Allowed, "the fleet is held")
}

// TestAStaleBookingCheckHoldsNothing: a check of a booking that Redis runs
// long after its caller gave up on it (it waited behind a stalled server)
// does not look for the booking, whose entry may have been cut or
// cancelled since: it holds nothing, where it held the target for a
// horizon and a window, and every process logged a pause no 429 asked
// for. A check that comes in time still finds a booking gone.
func TestAStaleBookingCheckHoldsNothing(t *testing.T) {
	srv := redistest.StartServer(t, "--enable-debug-command", "local")
	client := srv.Client(t)
	s, err := NewRedisStore(client, WithKeyPrefix(redistest.KeyPrefix(t)))
	require.NoError(t, err)
	ageData(t, client, s)
	ctx := context.Background()
	lim := Limit{Limit: 2, Window: time.Second}
	g := make([]Grant, 1)
	// book returns a booking of target that its process then gave back:
	// the log no longer holds it.
	book := func(target string, id uint64) {
		_, err := s.Reserve(ctx, target, lim, []Request{{ID: id, N: 1, MaxWait: -1}}, g)
		require.NoError(t, err)
		require.True(t, g[0].OK)
		require.NoError(t, s.Cancel(ctx, target, id, 1))
	}

	book("timely.example", 1)
	tctx, cancel := context.WithTimeout(ctx, DefaultStoreTimeout)
	require.Positive(t, s.staleAt(tctx, s.target("timely.example")), "the check carries when it goes stale")
	left, _, lost, err := s.checkBooking(tctx, "timely.example", 1, 1)
	cancel()
	require.NoError(t, err)
	require.True(t, lost, "a check in time finds the booking gone")
	require.Greater(t, left, time.Second)

	book("stale.example", 2)
	slept := make(chan error, 1)
	go func() { slept <- srv.Client(t).Do(ctx, "DEBUG", "SLEEP", "0.5").Err() }()
	time.Sleep(100 * time.Millisecond) // the server sleeps
	cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	_, _, _, err = s.checkBooking(cctx, "stale.example", 2, 1)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "the check waits behind the sleep")
	require.NoError(t, <-slept)
	left, young, err := s.readPause(ctx, "stale.example") // after the check, which was sent first
	require.NoError(t, err)
	require.False(t, young)
	require.Zero(t, left, "the stale check held nothing")
}

// TestABookingWhoseSlotHasComeIsNotChecked: once a reservation's slot has
// come, a later decision may cut its entry from the log (a window after
// it); a caller that asks that late (a starved process) is told the pause
// alone, and nothing is taken for lost.
func TestABookingWhoseSlotHasComeIsNotChecked(t *testing.T) {
	_, p, q, logs := twoProcessesOnAFullLog(t, "*=2/100ms")
	ctx := context.Background()
	r, err := p.ReserveN(ctx, "x.example", 1)
	require.NoError(t, err)
	require.Positive(t, r.Delay())
	time.Sleep(r.Delay() + 2*(100*time.Millisecond+DefaultMargin)) // two windows past the slot
	d, err := q.Allow(ctx, "x.example")                            // cuts the dead entries
	require.NoError(t, err)
	require.True(t, d.Allowed)
	left, err := r.Paused(ctx)
	require.NoError(t, err)
	require.Zero(t, left)
	require.Zero(t, logs.count("lost bookings"), "%q", logs.msgs)
}

// TestCancelsAreNeverTakenForALoss: processes that book and give their
// bookings back (the log's end among them, again and again, in any order)
// never take the log for lost: a process's own bookings are gone only by
// its own cancels, which it notes.
func TestCancelsAreNeverTakenForALoss(t *testing.T) {
	for _, listLogs := range []bool{false, true} {
		t.Run(fmt.Sprintf("list logs %v", listLogs), func(t *testing.T) {
			client := redistest.StartServer(t).Client(t)
			prefix := redistest.KeyPrefix(t)
			clock := newFakeClock()
			var procs []*RedisStore
			for range 3 {
				opts := []RedisOption{WithKeyPrefix(prefix)}
				if listLogs {
					opts = append(opts, WithListLogs())
				}
				s, err := NewRedisStore(client, opts...)
				require.NoError(t, err)
				s.now = clock.us.Load // and the data is old
				procs = append(procs, s)
			}
			ctx := context.Background()
			lim := Limit{Limit: 3, Window: 100 * time.Millisecond}
			rnd := rand.New(rand.NewPCG(1, 2))
			type booking struct {
				s  *RedisStore
				id uint64
				n  int
			}
			var held []booking
			cancels := 0
			for i := range 2000 {
				s := procs[rnd.IntN(len(procs))]
				switch {
				case len(held) > 0 && rnd.IntN(2) == 0: // give one back, most often the latest
					j := len(held) - 1
					if rnd.IntN(3) == 0 {
						j = rnd.IntN(len(held))
					}
					b := held[j]
					held = append(held[:j], held[j+1:]...)
					require.NoError(t, b.s.Cancel(ctx, "x.example", b.id, b.n))
					cancels++
				default:
					n := 1 + rnd.IntN(2)
					g := make([]Grant, 1)
					st, err := s.Reserve(ctx, "x.example", lim, []Request{{ID: uint64(i + 1), N: n, MaxWait: -1}}, g)
					require.NoError(t, err)
					require.False(t, st.Lost, "decision %d", i)
					require.True(t, g[0].OK)
					held = append(held, booking{s, uint64(i + 1), n})
				}
				if rnd.IntN(4) == 0 {
					clock.Advance(time.Duration(rnd.IntN(60)) * time.Millisecond)
					held = slices.DeleteFunc(held, func(booking) bool { return rnd.IntN(4) == 0 }) // sent
				}
			}
			require.Greater(t, cancels, 500)
		})
	}
}

// TestCancelIsNotALostLog: a process that saw another's booking as the
// log's last entry does not take the log for lost when that booking is
// cancelled: it is granted at once, as by a MemoryStore.
func TestCancelIsNotALostLog(t *testing.T) {
	const now = int64(1_800_000_000_000_000)
	b, client := fixedClockStore(t, now)
	a, err := NewRedisStore(client, WithKeyPrefix(b.prefix))
	require.NoError(t, err)
	a.now = b.now
	ctx := context.Background()
	lim := Limit{Limit: 1, Window: 10 * time.Second}
	g := make([]Grant, 1)
	_, err = b.Reserve(ctx, "x.example", lim, []Request{{ID: 1, N: 1, MaxWait: -1}}, g)
	require.NoError(t, err)
	require.True(t, g[0].OK)
	_, err = a.Reserve(ctx, "x.example", lim, []Request{{ID: 2, N: 1, MaxWait: 0}}, g)
	require.NoError(t, err)
	require.Equal(t, Grant{Delay: 10 * time.Second}, g[0], "a sees b's booking")
	require.NoError(t, b.Cancel(ctx, "x.example", 1, 1))
	st, err := a.Reserve(ctx, "x.example", lim, []Request{{ID: 3, N: 1, MaxWait: 0}}, g)
	require.NoError(t, err)
	require.Equal(t, Grant{OK: true}, g[0], "the cancelled booking frees the window")
	require.Zero(t, st.Paused)
}

// TestACancelFarAheadIsKeptUntilItsSlotPasses: a horizon of many windows
// books slots far ahead; the cancel of the log's latest one is kept in
// meta until a window after the horizon, not only for the liveness: a
// process that saw the cancelled slot as the log's last does not take the
// log for lost once meta's liveness has run out.
func TestACancelFarAheadIsKeptUntilItsSlotPasses(t *testing.T) {
	client := redistest.StartServer(t).Client(t)
	prefix := redistest.KeyPrefix(t)
	clock := newFakeClock()
	store := func() *RedisStore {
		s, err := NewRedisStore(client, WithKeyPrefix(prefix), WithLiveness(100*time.Millisecond), WithListLogs())
		require.NoError(t, err)
		s.now = clock.us.Load
		return s
	}
	a, b := store(), store()
	ageData(t, client, a)
	ctx := context.Background()
	lim := Limit{Limit: 1, Window: 50 * time.Millisecond, Ahead: 3 * time.Second}
	g := make([]Grant, 1)
	for i := range 20 { // queued waiters, a window apart, up to a second ahead
		_, err := b.Reserve(ctx, "x.example", lim, []Request{{ID: uint64(i + 1), N: 1, MaxWait: -1}}, g)
		require.NoError(t, err)
		require.True(t, g[0].OK)
	}
	_, err := a.Reserve(ctx, "x.example", lim, []Request{{ID: 100, N: 1, MaxWait: 0}}, g)
	require.NoError(t, err)
	require.Equal(t, Grant{Delay: time.Second}, g[0], "a sees b's last booking")
	require.NoError(t, b.Cancel(ctx, "x.example", 20, 1))
	time.Sleep(300 * time.Millisecond) // past the liveness (four windows: 200 ms)
	clock.Advance(300 * time.Millisecond)
	st, err := a.Reserve(ctx, "x.example", lim, []Request{{ID: 101, N: 1, MaxWait: -1}}, g)
	require.NoError(t, err)
	require.False(t, st.Lost, "the cancelled slot is still known")
	require.Equal(t, granted(650*time.Millisecond), g[0], "after b's 19th booking, at 950 ms")
}

// TestCancelOfManyUnits: cancelling a request of many units with many
// entries behind it removes exactly its units, keeps the others in order
// and the log's TTL, and rewrites the part of the log it searched once
// instead of searching it again per unit (no LREM).
func TestCancelOfManyUnits(t *testing.T) {
	const now = int64(1_800_000_000_000_000)
	s, client := fixedClockStore(t, now)
	ctx := context.Background()
	lim := Limit{Limit: 10_000, Window: time.Minute}
	g := make([]Grant, 1)
	_, err := s.Reserve(ctx, "x.example", lim, []Request{{ID: 1, N: 2_000, MaxWait: -1}}, g)
	require.NoError(t, err)
	require.True(t, g[0].OK)
	reqs := make([]Request, 2_000)
	for i := range reqs {
		reqs[i] = Request{ID: uint64(10 + i), N: 1, MaxWait: -1}
	}
	_, err = s.Reserve(ctx, "x.example", lim, reqs, make([]Grant, len(reqs)))
	require.NoError(t, err)
	log := s.keys("x.example")[0]
	before, err := client.LRange(ctx, log, 2_000, -1).Result()
	require.NoError(t, err)
	ttl, err := client.PTTL(ctx, log).Result()
	require.NoError(t, err)

	require.NoError(t, client.ConfigResetStat(ctx).Err())
	require.NoError(t, s.Cancel(ctx, "x.example", 1, 2_000))
	after, err := client.LRange(ctx, log, 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, before, after, "exactly the request's units are gone")
	left, err := client.PTTL(ctx, log).Result()
	require.NoError(t, err)
	require.InDelta(t, float64(ttl), float64(left), float64(time.Second), "the TTL is kept")
	stats, err := client.Info(ctx, "commandstats").Result()
	require.NoError(t, err)
	require.NotContains(t, stats, "cmdstat_lrem", "one rewrite, not an LREM per unit")
}

// logEntry is a log element as the script writes it: the slot (8 bytes,
// big-endian), then the member.
func logEntry(slot int64, member string) string {
	return string(binary.BigEndian.AppendUint64(nil, uint64(slot))) + member
}

// targetMeta is a target's meta key, parsed: its six numbers and its
// inline log's entries (as logEntry writes them).
type targetMeta struct {
	pause, live, cancelled, expires, metaExpires, inline int64
	entries                                              []string
	cut                                                  int64 // a list log's latest cut of its dead entries (µs); -1 when meta keeps none
}

// readMeta reads the meta key of s's target; a missing key, or one in the
// 32-byte form of earlier releases, reads as a log in the list (inline -1).
func readMeta(t *testing.T, client redis.UniversalClient, s *RedisStore, target string) targetMeta {
	t.Helper()
	v, err := client.Get(context.Background(), s.keys(target)[1]).Bytes()
	if errors.Is(err, redis.Nil) {
		return targetMeta{inline: -1, cut: -1}
	}
	require.NoError(t, err)
	n := func(i int) int64 { return int64(binary.BigEndian.Uint64(v[8*i:])) }
	if len(v) == 32 { // the form of releases before inline logs (WithListLogs)
		return targetMeta{n(0), n(1), n(2), n(3), 0, -1, nil, -1}
	}
	require.GreaterOrEqual(t, len(v), 48, "meta %q", v)
	m := targetMeta{n(0), n(1), n(2), n(3), n(4), n(5), nil, -1}
	if m.inline < 0 && len(v) == 56 {
		m.cut = n(6)
		return m
	}
	pos := 48 + 8*int(max(m.inline, 0))
	for i := range m.inline {
		ml := int(v[pos])
		m.entries = append(m.entries, string(v[48+8*i:56+8*i])+string(v[pos+1:pos+1+ml]))
		pos += 1 + ml
	}
	require.Equal(t, len(v), pos, "meta %q holds its numbers and inline log alone", v)
	return m
}

// logOf returns the entries of s's log for target, wherever it lives: in
// meta, or in the list.
func logOf(t *testing.T, client redis.UniversalClient, s *RedisStore, target string) []string {
	t.Helper()
	ctx := context.Background()
	listed, err := client.LRange(ctx, s.keys(target)[0], 0, -1).Result()
	require.NoError(t, err)
	m := readMeta(t, client, s, target)
	if m.inline >= 0 {
		require.Empty(t, listed, "an inline log has no list")
		return m.entries
	}
	return listed
}

// logTTL returns the TTL of the key that holds s's log for target: meta
// while the log is inline, else the list.
func logTTL(t *testing.T, client redis.UniversalClient, s *RedisStore, target string) time.Duration {
	t.Helper()
	key := s.keys(target)[0]
	if readMeta(t, client, s, target).inline >= 0 {
		key = s.keys(target)[1]
	}
	ttl, err := client.PTTL(context.Background(), key).Result()
	require.NoError(t, err)
	return ttl
}

// TestAFullWindowIsReadFromTheTail: after a decision that found the window
// full, the script decides from the log's length and its limit-th entry
// from the end, without reading the log's head; once that entry is dead,
// the window is no longer full, whatever the log's length, and the dead
// entries no longer count.
func TestAFullWindowIsReadFromTheTail(t *testing.T) {
	s, client, clock := fakeClockStore(t)
	s.inlineMax = "0" // the log is the list
	ctx := context.Background()
	lim := Limit{Limit: 4, Window: time.Second}
	reserve := func(wantOK bool, wantDelay time.Duration, wantRemaining int) {
		t.Helper()
		grants := make([]Grant, 1)
		st, err := s.Reserve(ctx, "example.com", lim, []Request{{ID: nextID(), N: 1, MaxWait: 0}}, grants)
		require.NoError(t, err)
		require.Equal(t, Grant{OK: wantOK, Delay: wantDelay}, grants[0])
		require.Equal(t, wantRemaining, st.Remaining)
	}
	// Slots at 0, 100, 600 and 700 ms.
	for i, step := range []time.Duration{0, 100, 500, 100} {
		clock.Advance(step * time.Millisecond)
		reserve(true, 0, 3-i)
	}
	clock.Advance(100 * time.Millisecond) // 800 ms: full until the slot at 0 leaves
	require.NoError(t, client.ConfigResetStat(ctx).Err())
	reserve(false, 200*time.Millisecond, 0)
	stats, err := client.Info(ctx, "commandstats").Result()
	require.NoError(t, err)
	require.NotContains(t, stats, "cmdstat_lrange:", "the latest decision found the window full: no head read")
	require.NotContains(t, stats, "cmdstat_llen:", "a request that does not wait writes nothing: no length read")
	require.Contains(t, stats, "cmdstat_lindex:calls=2,", "the limit-th entry from the end, and the last")
	clock.Advance(350 * time.Millisecond) // 1150 ms: the slots at 0 and 100 are dead
	reserve(true, 0, 1)
	reserve(true, 0, 0)
	reserve(false, 450*time.Millisecond, 0) // until the slot at 600 leaves
}

// TestALongLogIsCutOncePerQuarterWindow: a log too long for meta, whose
// window is not full, is decided from its length and last entry alone. Its
// dead entries are cut at the first call a quarter window after the latest
// cut, whichever process makes it (meta keeps when that was), and counted
// until then, so that Remaining reads lower than the room there is, never
// higher, by no more than the entries booked within a quarter window. A
// caller pacing itself at a gap, whose bookings carry the log's last entry
// into each quarter ahead of its calls, is cut as often.
func TestALongLogIsCutOncePerQuarterWindow(t *testing.T) {
	s, client, clock := fakeClockStore(t)
	other, err := NewRedisStore(client, WithKeyPrefix(s.prefix)) // a second process
	require.NoError(t, err)
	other.now = s.now
	ctx := context.Background()
	lim := Limit{Limit: 100, Window: time.Second} // quarters of 250 ms
	start := clock.us.Load()
	at := func(ms int64) {
		t.Helper()
		now := start + ms*1000
		require.GreaterOrEqual(t, now, clock.us.Load())
		clock.us.Store(now)
	}
	reserve := func(s *RedisStore, target string, n int) int {
		t.Helper()
		reqs := make([]Request, n)
		for i := range reqs {
			reqs[i] = Request{ID: nextID(), N: 1, MaxWait: 0}
		}
		grants := make([]Grant, n)
		st, err := s.Reserve(ctx, target, lim, reqs, grants)
		require.NoError(t, err)
		for i, g := range grants {
			require.Equal(t, Grant{OK: true}, g, "request %d", i)
		}
		return st.Remaining
	}
	logLen := func(target string) int64 {
		t.Helper()
		n, err := client.LLen(ctx, s.keys(target)[0]).Result()
		require.NoError(t, err)
		return n
	}

	at(100)
	require.Equal(t, 30, reserve(s, "a.example", 70)) // too many for meta
	require.EqualValues(t, 70, logLen("a.example"), "the log is the list")
	require.EqualValues(t, -1, readMeta(t, client, s, "a.example").cut, "no cut yet")
	at(1050)
	require.Equal(t, 29, reserve(s, "a.example", 1)) // the first cut (nothing dead)
	require.Equal(t, start+1_050_000, readMeta(t, client, s, "a.example").cut)
	// At 1,101 and 1,299 ms the 70 slots at 100 ms are dead, and the
	// latest cut was less than a quarter window ago: they are counted, by
	// either process, not cut.
	at(1101)
	require.Equal(t, 28, reserve(other, "a.example", 1), "70 dead entries counted: 98 in truth")
	at(1299)
	require.Equal(t, 27, reserve(s, "a.example", 1), "70 dead entries counted: 97 in truth")
	require.EqualValues(t, 73, logLen("a.example"), "nothing cut")
	// At 1,300 ms, a quarter window after the cut, the other process cuts.
	at(1300)
	require.Equal(t, 96, reserve(other, "a.example", 1))
	require.EqualValues(t, 4, logLen("a.example"), "the dead cut")
	require.Equal(t, start+1_300_000, readMeta(t, client, s, "a.example").cut)

	// One caller paced at a gap of 10 ms, each call at its previous
	// booking's slot, for three windows: at most 26 dead entries counted
	// (a quarter window's bookings and one), and Remaining short by as
	// many at most.
	paced := Limit{Limit: 200, Window: time.Second, Gap: 10 * time.Millisecond}
	mostDead := 0
	for i := range 300 {
		grants := make([]Grant, 1)
		st, err := s.Reserve(ctx, "b.example", paced, []Request{{ID: nextID(), N: 1, MaxWait: -1}}, grants)
		require.NoError(t, err)
		require.True(t, grants[0].OK)
		dead, live := deadAndLive(t, client, s, "b.example", clock.us.Load()-time.Second.Microseconds())
		mostDead = max(mostDead, dead)
		require.LessOrEqual(t, dead, 26, "call %d: dead entries in the log", i)
		require.LessOrEqual(t, st.Remaining, 200-live, "call %d: never more room than there is", i)
		require.GreaterOrEqual(t, st.Remaining, 200-live-dead, "call %d", i)
		clock.Advance(grants[0].Delay)
	}
	require.Greater(t, mostDead, 10, "dead entries were counted uncut")
}

// TestTheLogsTTLIsRenewedWhenShort: a write renews the log's TTL, to three
// spares past the window, only when the expiry kept in meta falls short of
// a window and a spare past its last slot, or when the write made the list
// anew (meta may tell of a log that is gone); every log it leaves has a
// TTL that lasts that long.
func TestTheLogsTTLIsRenewedWhenShort(t *testing.T) {
	s, client, clock := fakeClockStore(t)
	s.inlineMax = "0" // the log is the list
	ctx := context.Background()
	lim := Limit{Limit: 1000, Window: 100 * time.Millisecond} // spare: 0.5 s
	logKey := s.keys("example.com")[0]
	// The log's renewals: PEXPIREs but those of the heartbeat, which sets
	// the TTL of the set it ZADDs to.
	pexpires := func() int {
		t.Helper()
		stats, err := client.Info(ctx, "commandstats").Result()
		require.NoError(t, err)
		calls := func(cmd string) int {
			_, rest, ok := strings.Cut(stats, "cmdstat_"+cmd+":calls=")
			if !ok {
				return 0
			}
			n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			require.NoError(t, err)
			return n
		}
		return calls("pexpire") - calls("zadd")
	}
	reserve := func(s *RedisStore) {
		t.Helper()
		grants := make([]Grant, 1)
		_, err := s.Reserve(ctx, "example.com", lim, []Request{{ID: nextID(), N: 1, MaxWait: 0}}, grants)
		require.NoError(t, err)
		require.True(t, grants[0].OK)
		ttl, err := client.PTTL(ctx, logKey).Result()
		require.NoError(t, err)
		require.Greater(t, ttl, lim.Window, "the log lasts a window past its last slot")
	}
	require.NoError(t, client.ConfigResetStat(ctx).Err())
	reserve(s) // makes the log: 1.6 s of TTL, a window and three spares
	require.Equal(t, 1, pexpires())
	// A slot every 50 ms (the one before is still live: the log stays)
	// up to 1,000 ms, whose window and spare end at 1,600 ms, when the
	// TTL does.
	for range 20 {
		clock.Advance(50 * time.Millisecond)
		reserve(s)
	}
	require.Equal(t, 1, pexpires(), "no renewal while the TTL lasts")
	clock.Advance(50 * time.Millisecond) // 1,050 ms: 1,650 ms is past 1,600
	reserve(s)
	require.Equal(t, 2, pexpires(), "renewed when it falls short")

	// The log is gone (evicted, say) while meta still tells of its TTL. A
	// process that saw none of it (so does not take it for lost) makes it
	// anew, with a TTL.
	require.NoError(t, client.Del(ctx, logKey).Err())
	other, err := NewRedisStore(client, WithKeyPrefix(s.prefix))
	require.NoError(t, err)
	other.now, other.inlineMax = s.now, s.inlineMax
	clock.Advance(10 * time.Millisecond)
	reserve(other)
	require.Equal(t, 3, pexpires(), "a list made anew is given its TTL")
}

// TestTheLogOutlivesALargerMargin: after every write, the log lasts (as
// its meta tells, which the TTL follows) a window and a spare past its last
// slot, so a process whose margin is up to a spare larger than the
// writer's finds every entry it still counts.
func TestTheLogOutlivesALargerMargin(t *testing.T) {
	for _, inline := range []bool{true, false} {
		t.Run(fmt.Sprintf("inline=%v", inline), func(t *testing.T) {
			s, client, clock := fakeClockStore(t)
			if !inline {
				s.inlineMax = "0"
			}
			ctx := context.Background()
			lim := Limit{Limit: 1000, Window: 100 * time.Millisecond} // spare: 0.5 s
			larger := lim.Window + 500*time.Millisecond
			grants := make([]Grant, 1)
			for i := range 60 { // a slot every 50 ms for 3 s
				clock.Advance(50 * time.Millisecond)
				_, err := s.Reserve(ctx, "example.com", lim, []Request{{ID: nextID(), N: 1, MaxWait: 0}}, grants)
				require.NoError(t, err)
				require.True(t, grants[0].OK)
				require.Zero(t, grants[0].Delay, "the slot is now")
				m := readMeta(t, client, s, "example.com")
				require.Equal(t, inline, m.inline >= 0, "where the log is")
				expires := m.expires // the list's, as its TTL was last set
				if inline {
					expires = m.metaExpires
				}
				require.GreaterOrEqual(t, expires-clock.us.Load(), larger.Microseconds(),
					"write %d: the log ends too soon for a margin 500 ms larger", i)
			}
		})
	}
}

// TestAFullWindowBoundsEachRequestFromTheEnd: a full window read from its
// tail without its length (requests that do not wait) finds each
// request's bound counting from the log's end, past dead entries the
// head still holds; a request that waits has the length read.
func TestAFullWindowBoundsEachRequestFromTheEnd(t *testing.T) {
	s, client, clock := fakeClockStore(t)
	s.inlineMax = "0" // the log is the list
	ctx := context.Background()
	lim := Limit{Limit: 4, Window: time.Second}
	reserve := func(n int, maxWait time.Duration) Grant {
		t.Helper()
		grants := make([]Grant, 1)
		_, err := s.Reserve(ctx, "example.com", lim, []Request{{ID: nextID(), N: n, MaxWait: maxWait}}, grants)
		require.NoError(t, err)
		return grants[0]
	}
	// Slots at 0, 100, 1050, 1060 and 1070 ms. The one at 0 is dead from
	// 1000 ms on, but each write cut nothing (one dead entry is left for a
	// later cut): the log holds it at its head.
	start := clock.us.Load()
	for _, at := range []time.Duration{0, 100, 1050, 1060, 1070} {
		clock.us.Store(start + (at * time.Millisecond).Microseconds())
		require.True(t, reserve(1, 0).OK, "at %v", at)
	}
	clock.Advance(10 * time.Millisecond) // 1080 ms
	require.NoError(t, client.ConfigResetStat(ctx).Err())
	require.Equal(t, Grant{Delay: 20 * time.Millisecond}, reserve(1, 0), "until the slot at 100 leaves")
	require.Equal(t, Grant{Delay: 970 * time.Millisecond}, reserve(2, 0), "two units: until the slot at 1050 leaves")
	stats, err := client.Info(ctx, "commandstats").Result()
	require.NoError(t, err)
	require.NotContains(t, stats, "cmdstat_llen:", "refusals of requests that do not wait")
	n, err := client.LLen(ctx, s.keys("example.com")[0]).Result()
	require.NoError(t, err)
	require.Equal(t, int64(5), n, "the dead entry is still at the head")

	require.NoError(t, client.ConfigResetStat(ctx).Err())
	require.Equal(t, Grant{OK: true, Delay: 20 * time.Millisecond}, reserve(1, -1), "a waiter is booked")
	stats, err = client.Info(ctx, "commandstats").Result()
	require.NoError(t, err)
	require.Contains(t, stats, "cmdstat_llen:calls=1,", "a request that waits may write: the length is read")
}

// TestJoinedTellsWhenAProcessEntersTheCount: a reply says Joined when its
// call added the process to the target's live processes: its first call,
// and its first after it dropped out of the count for want of marks; not
// the calls in between, nor another process's calls.
func TestJoinedTellsWhenAProcessEntersTheCount(t *testing.T) {
	a, client, clock := fakeClockStore(t)
	b, err := NewRedisStore(client, WithKeyPrefix(a.prefix), WithLiveness(2*time.Second))
	require.NoError(t, err)
	b.now = a.now
	a.liveness = 2 * time.Second
	ctx := context.Background()
	lim := Limit{Limit: 100, Window: 100 * time.Millisecond}
	// Every call marks its process live: a mark is due a quarter of the
	// liveness after the last, on the real clock, which the fake one
	// outruns.
	reserve := func(s *RedisStore) State {
		t.Helper()
		s.target("example.com").marked.Store(0)
		st, err := s.Reserve(ctx, "example.com", lim, []Request{{ID: nextID(), N: 1, MaxWait: 0}}, make([]Grant, 1))
		require.NoError(t, err)
		return st
	}
	st := reserve(a)
	require.Equal(t, 1, st.Live)
	require.True(t, st.Joined, "a's first call")
	clock.Advance(10 * time.Millisecond)
	st = reserve(b)
	require.Equal(t, 2, st.Live)
	require.True(t, st.Joined, "b's first call")
	for range 10 { // b's mark is less than the liveness old: b stays counted
		clock.Advance(100 * time.Millisecond)
		st = reserve(a)
		require.False(t, st.Joined, "a is counted")
		require.Equal(t, 2, st.Live)
	}
	// b stops for longer than the liveness: a's marks drop it from the
	// count, and b's next call brings it back.
	for range 25 {
		clock.Advance(100 * time.Millisecond)
		st = reserve(a)
		require.False(t, st.Joined)
	}
	require.Equal(t, 1, st.Live, "b dropped out")
	st = reserve(b)
	require.True(t, st.Joined, "b came back")
	require.Equal(t, 2, st.Live)
}

// TestAShareHolderIsStillCountedWhenANewcomerJoins: a process keeps a
// fallback share for half the liveness after its last answer, and its
// last mark may be older than that answer; the liveness (four windows at
// least) keeps it in the count meanwhile, so a newcomer does not join an
// empty count and take the whole limit beside it.
func TestAShareHolderIsStillCountedWhenANewcomerJoins(t *testing.T) {
	p, client, clock := fakeClockStore(t) // the default liveness, 10 s
	j, err := NewRedisStore(client, WithKeyPrefix(p.prefix))
	require.NoError(t, err)
	j.now = p.now
	ctx := context.Background()
	lim := Limit{Limit: 4, Window: 5*time.Second + DefaultMargin}
	reserve := func(s *RedisStore) State {
		t.Helper()
		st, err := s.Reserve(ctx, "example.com", lim, []Request{{ID: nextID(), N: 1, MaxWait: 0}}, make([]Grant, 1))
		require.NoError(t, err)
		return st
	}
	require.Equal(t, 1, reserve(p).Live, "p marks itself, alone")
	clock.Advance(2400 * time.Millisecond)
	reserve(p) // answered, not marked: a mark is due a quarter of the liveness later
	clock.Advance(7800 * time.Millisecond)
	st := reserve(j) // 10.2 s after p's mark, 7.8 s after p's last answer
	require.True(t, st.Joined)
	require.Equal(t, 2, st.Live, "p, whose share holds until half the liveness after its last answer, is still counted")
}

func TestAPauseOutlivesAStoreThatLostIt(t *testing.T) {
	client, process := processesOnOneRedis(t, "*=100/1s")
	ctx := context.Background()
	heard, saw := process(), process()
	_, err := heard.Pause(ctx, "example.com", 3*time.Second) // it heard a 429
	require.NoError(t, err)
	d, err := saw.Allow(ctx, "example.com") // the store told it
	require.NoError(t, err)
	require.False(t, d.Allowed)

	require.NoError(t, client.FlushAll(ctx).Err()) // Redis restarted empty
	// Taken for old data, so that a young store's hold does not stand in
	// for the pause: only the pause written back refuses from here on.
	ageData(t, client, heard.store.(*RedisStore))
	for name, tr := range map[string]*Throttler{"the process that heard the 429": heard, "a process the store told": saw} {
		d, err := tr.Allow(ctx, "example.com")
		require.NoError(t, err)
		require.False(t, d.Allowed, "%s admits during the pause", name)
		require.InDelta(t, 3*time.Second, d.RetryAfter, float64(500*time.Millisecond), name)
		short, cancel := context.WithTimeout(ctx, time.Second)
		start := time.Now()
		err = tr.Wait(short, "example.com")
		cancel()
		require.ErrorIs(t, err, ErrWouldExceedDeadline, name)
		require.Less(t, time.Since(start), 500*time.Millisecond, "%s: a pause past the deadline fails at once", name)
	}
	d, err = process().Allow(ctx, "example.com")
	require.NoError(t, err)
	require.False(t, d.Allowed, "the pause was told to the store again, for the processes that never heard of it")
	require.InDelta(t, 3*time.Second, d.RetryAfter, float64(500*time.Millisecond))
}

func TestASleepingWaiterWritesALostPauseBack(t *testing.T) {
	client, process := processesOnOneRedis(t, "*=100/1s")
	ctx := context.Background()
	heard := process()
	_, err := heard.Pause(ctx, "example.com", 3*time.Second)
	require.NoError(t, err)
	waited := make(chan error, 1)
	go func() { waited <- heard.Wait(ctx, "example.com") }() // sleeps through the pause
	time.Sleep(100 * time.Millisecond)

	require.NoError(t, client.FlushAll(ctx).Err()) // Redis restarted empty
	time.Sleep(2 * PauseRecheck)
	d, err := process().Allow(ctx, "example.com") // it never heard of the pause
	require.NoError(t, err)
	require.False(t, d.Allowed, "the sleeping waiter's process wrote the pause back")
	require.InDelta(t, 2400*time.Millisecond, d.RetryAfter, float64(400*time.Millisecond))
	require.NoError(t, <-waited)
}

// TestASlotBookedBeforeALossIsNotSentInsideAForgottenPause: a process
// sleeps towards a slot it booked; another hears a 429 and pauses the
// fleet; Redis restarts empty before anyone writes the pause back (the
// process that heard it has no waiter sleeping through it). The sleeper's
// check before sending must not read "no pause".
func TestASlotBookedBeforeALossIsNotSentInsideAForgottenPause(t *testing.T) {
	client := redistest.StartServer(t).Client(t)
	prefix := redistest.KeyPrefix(t)
	rules, err := ParseRules("*=20/1s")
	require.NoError(t, err)
	process := func(logger *slog.Logger) *Throttler {
		s, err := NewRedisStore(client, WithKeyPrefix(prefix))
		require.NoError(t, err)
		ageData(t, client, s)
		tr, err := New(rules, WithStore(s), WithStoreTimeout(time.Second), WithLogger(logger))
		require.NoError(t, err)
		t.Cleanup(func() { _ = tr.Close() })
		return tr
	}
	ctx := context.Background()
	logs := &logRecorder{}
	sleeper, heard := process(slog.New(logs)), process(quietLogger())
	var r *Reservation
	for range 21 { // the 21st slot is in the next window
		r, err = sleeper.ReserveN(ctx, "example.com", 1)
		require.NoError(t, err)
	}
	require.Greater(t, r.Delay(), 500*time.Millisecond)
	_, err = heard.Pause(ctx, "example.com", 4*time.Second)
	require.NoError(t, err)

	require.NoError(t, client.FlushAll(ctx).Err()) // Redis restarted empty
	left, err := sleeper.Paused(ctx, "example.com")
	require.NoError(t, err)
	require.Greater(t, left, r.Delay(), "the check before sending holds the slot back")
	require.Equal(t, 1, logs.count("the store's data is new"), "and says why: %q", logs.msgs)
}

// TestAPauseReadHoldsASlotTheStoreLost: a process asks for the target's
// pause before it sends on a slot it booked earlier (the transport does).
// When Redis has lost its data meanwhile (restarted empty, and with it any
// pause the fleet heard of), the read reports the hold a reserve would put
// on the target, not "no pause", so that the slot is not sent inside a
// pause the store forgot. A target whose keys merely expired, the data
// being old, reads as not paused.
func TestAPauseReadHoldsASlotTheStoreLost(t *testing.T) {
	s, client := startStore(t)
	ctx := context.Background()
	lim := Limit{Limit: 5, Window: time.Second}
	g := make([]Grant, 1)
	_, err := s.Reserve(ctx, "a.example", lim, []Request{{ID: nextID(), N: 1, MaxWait: -1}}, g)
	require.NoError(t, err)
	require.True(t, g[0].OK)
	require.Less(t, g[0].Delay, 100*time.Millisecond, "the data is old: no hold")
	read := func(target string) time.Duration {
		t.Helper()
		left, err := s.Pause(ctx, target, 0)
		require.NoError(t, err)
		return left
	}
	require.Zero(t, read("a.example"))

	require.NoError(t, client.Del(ctx, s.keys("a.example")...).Err())
	require.Zero(t, read("a.example"), "the target's keys expired; the data is old")

	require.NoError(t, client.FlushAll(ctx).Err()) // Redis restarted empty
	require.Equal(t, 2*time.Second, read("a.example"), "held for a horizon (a window by default) and a window from now, when the data began")
	require.Zero(t, read("b.example"), "no booking of this process on it: read as before")
	_, err = s.Reserve(ctx, "a.example", lim, []Request{{ID: nextID(), N: 1, MaxWait: 0}}, g)
	require.NoError(t, err)
	require.False(t, g[0].OK, "a reserve holds the target as the read said")
	require.InDelta(t, 2*time.Second, g[0].Delay, float64(200*time.Millisecond))
}

// processesOnOneRedis starts a Redis and returns its client and a function
// that starts a process on it: a Throttler with a RedisStore of its own
// and rule, closed when t ends.
func processesOnOneRedis(t *testing.T, rule string) (*redis.Client, func() *Throttler) {
	t.Helper()
	client := redistest.StartServer(t).Client(t)
	prefix := redistest.KeyPrefix(t)
	rules, err := ParseRules(rule)
	require.NoError(t, err)
	return client, func() *Throttler {
		s, err := NewRedisStore(client, WithKeyPrefix(prefix))
		require.NoError(t, err)
		tr, err := New(rules, WithStore(s), WithStoreTimeout(time.Second), WithLogger(quietLogger()))
		require.NoError(t, err)
		t.Cleanup(func() { _ = tr.Close() })
		return tr
	}
}

// TestAShortLogLivesInMeta: a log of up to 64 entries is kept in the
// target's meta key, where a decision reads and writes it with one GET and
// one SET and no list command; a log that outgrows it moves to the list,
// keeping every entry in slot order, and comes back once the list is gone.
func TestAShortLogLivesInMeta(t *testing.T) {
	s, client, clock := fakeClockStore(t)
	ctx := context.Background()
	const target = "x.example"
	lim := Limit{Limit: 100, Window: time.Second}
	commands := func() string {
		t.Helper()
		stats, err := client.Info(ctx, "commandstats").Result()
		require.NoError(t, err)
		return stats
	}
	var want []string
	reserve := func() {
		t.Helper()
		id := nextID()
		grants := make([]Grant, 1)
		_, err := s.Reserve(ctx, target, lim, []Request{{ID: id, N: 1, MaxWait: 0}}, grants)
		require.NoError(t, err)
		require.Equal(t, Grant{OK: true}, grants[0])
		want = append(want, logEntry(clock.us.Load(), s.member(id)))
	}
	reserve() // the first call marks the process live
	require.NoError(t, client.ConfigResetStat(ctx).Err())
	for range 63 {
		clock.Advance(time.Millisecond)
		reserve()
	}
	stats := commands()
	for _, cmd := range []string{"lrange", "llen", "lindex", "rpush", "ltrim", "del", "pexpire"} {
		require.NotContains(t, stats, "cmdstat_"+cmd+":", "a short log is read and written in meta alone")
	}
	require.Contains(t, stats, "cmdstat_set:calls=63,", "one write of meta per decision")
	m := readMeta(t, client, s, target)
	require.Equal(t, int64(64), m.inline)
	require.Equal(t, want, m.entries)
	ttl, err := client.PTTL(ctx, s.keys(target)[1]).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, lim.Window, "meta lasts the log's window past its last entry")

	clock.Advance(time.Millisecond)
	reserve() // the 65th entry: the log moves to the list
	require.Equal(t, int64(-1), readMeta(t, client, s, target).inline)
	require.Equal(t, want, logOf(t, client, s, target))
	ttl, err = client.PTTL(ctx, s.keys(target)[0]).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, lim.Window, "the list lasts its window past its last entry")

	clock.Advance(2 * lim.Window) // every entry is dead: the list goes, and the log comes back
	want = nil
	reserve()
	require.Equal(t, int64(1), readMeta(t, client, s, target).inline)
	require.Equal(t, want, logOf(t, client, s, target))
}

// TestListLogsShareTargetsWithTheReleaseBefore: a rolling upgrade from the
// release before short logs moved into meta (its script is in testdata).
// Its processes and processes with WithListLogs keep one quota, the form
// of meta that release reads and writes; then processes with and without
// WithListLogs keep one quota, short logs in meta or not.
func TestListLogsShareTargetsWithTheReleaseBefore(t *testing.T) {
	src, err := os.ReadFile("testdata/sliding_log-958864a.lua")
	require.NoError(t, err)
	earlier := newScript(string(src))
	client := redistest.StartServer(t).Client(t)
	prefix := redistest.KeyPrefix(t)
	clock := newFakeClock()
	store := func(opts ...RedisOption) *RedisStore {
		s, err := NewRedisStore(client, append([]RedisOption{WithKeyPrefix(prefix)}, opts...)...)
		require.NoError(t, err)
		s.now = clock.us.Load
		return s
	}
	old, listed, inline := store(), store(WithListLogs()), store()
	old.script = &earlier
	ctx := context.Background()
	lim := Limit{Limit: 3, Window: time.Minute}
	reserve := func(s *RedisStore, target string, n int) bool {
		t.Helper()
		g := make([]Grant, 1)
		_, err := s.Reserve(ctx, target, lim, []Request{{ID: nextID(), N: n, MaxWait: 0}}, g)
		require.NoError(t, err)
		clock.Advance(time.Millisecond)
		return g[0].OK
	}

	// The first step: the earlier release and WithListLogs.
	require.True(t, reserve(listed, "x.example", 2))
	meta, err := client.Get(ctx, listed.keys("x.example")[1]).Result()
	require.NoError(t, err)
	require.Len(t, meta, 32, "meta in the earlier release's form")
	require.True(t, reserve(old, "x.example", 1))
	require.False(t, reserve(listed, "x.example", 1), "the window holds 3")
	require.False(t, reserve(old, "x.example", 1), "the window holds 3")
	require.Len(t, logOf(t, client, listed, "x.example"), 3)
	_, err = listed.Pause(ctx, "x.example", time.Hour)
	require.NoError(t, err)
	left, err := old.Pause(ctx, "x.example", 0)
	require.NoError(t, err)
	require.Greater(t, left, 59*time.Minute, "the earlier release sees the pause")

	// The second step: WithListLogs and short logs in meta.
	require.True(t, reserve(inline, "y.example", 2))
	require.Equal(t, int64(2), readMeta(t, client, inline, "y.example").inline)
	require.False(t, reserve(listed, "y.example", 2), "2 more would make 4")
	require.Equal(t, int64(2), readMeta(t, client, inline, "y.example").inline, "a refusal keeps the short log")
	require.True(t, reserve(listed, "y.example", 1))
	require.False(t, reserve(inline, "y.example", 1), "the window holds 3")
	require.Len(t, logOf(t, client, inline, "y.example"), 3, "WithListLogs moved the short log to the list, whole")
}

// TestProcessesLearnTheirPlaces: a call that marks a process live tells it
// its place among the live processes, in the order of their names, which
// every process learns alike; a call that does not mark tells none.
func TestProcessesLearnTheirPlaces(t *testing.T) {
	first, client, clock := fakeClockStore(t) // the default liveness, 10 s
	stores := []*RedisStore{first}
	for range 2 {
		s, err := NewRedisStore(client, WithKeyPrefix(first.prefix))
		require.NoError(t, err)
		s.now = first.now
		stores = append(stores, s)
	}
	ctx := context.Background()
	lim := Limit{Limit: 100, Window: time.Second + DefaultMargin}
	reserve := func(s *RedisStore) State {
		t.Helper()
		st, err := s.Reserve(ctx, "example.com", lim, []Request{{ID: nextID(), N: 1, MaxWait: 0}}, make([]Grant, 1))
		require.NoError(t, err)
		return st
	}
	for i, s := range stores {
		st := reserve(s) // each joins, and marks itself
		require.Equal(t, i+1, st.Live)
		require.Positive(t, st.Place)
		require.LessOrEqual(t, st.Place, st.Live)
	}
	require.Zero(t, reserve(first).Place, "no mark, no place")

	clock.Advance(2600 * time.Millisecond)
	byName := slices.Clone(stores)
	slices.SortFunc(byName, func(a, b *RedisStore) int { return cmp.Compare(a.procNum, b.procNum) })
	for _, s := range stores {
		s.target("example.com").marked.Store(0) // a mark is due (a quarter of the liveness after the last, by the local clock)
		st := reserve(s)
		require.Equal(t, 3, st.Live)
		require.Equal(t, slices.Index(byName, s)+1, st.Place, "places follow the processes' names")
	}
}

// A request of many units is one long script run, a log entry per unit
// (some 60 ms for 20,000 on an idle server): with the store timeout alone
// it failed on a healthy Redis every time and put its target in the
// fallback. Its calls get more time per unit.
func TestAManyUnitRequestFitsItsStoreCall(t *testing.T) {
	s, _ := startStore(t)
	rules, err := ParseRules("*=100000/1s")
	require.NoError(t, err)
	tr, err := New(rules, WithStore(s), WithLogger(quietLogger()))
	require.NoError(t, err)
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const host = "many-units.example"

	require.NoError(t, tr.WaitN(ctx, host, 20_000))
	r, err := tr.ReserveN(ctx, host, 20_000)
	require.NoError(t, err)
	require.NoError(t, r.Cancel(ctx))
	d, err := tr.AllowN(ctx, host, 80_000)
	require.NoError(t, err)
	require.True(t, d.Allowed, "the cancelled units are free again")
	require.Equal(t, ModeStore, tr.Mode(), "the store never counted as failed")
}
