package throttle

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

// reserveMany makes per Reserve calls on each of targets targets, all at
// once, each asking for one unit with no wait, and returns how many were
// granted per target.
func reserveMany(t *testing.T, s *RedisStore, lim Limit, targets, per int) []int64 {
	t.Helper()
	granted := make([]atomic.Int64, targets)
	var wg sync.WaitGroup
	errs := make(chan error, targets*per)
	for i := range targets {
		for range per {
			wg.Go(func() {
				g := make([]Grant, 1)
				if _, err := s.Reserve(context.Background(), fmt.Sprintf("t%d.example", i), lim, []Request{{ID: nextID(), N: 1}}, g); err != nil {
					errs <- err
					return
				}
				if g[0].OK {
					granted[i].Add(1)
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	out := make([]int64, targets)
	for i := range granted {
		out[i] = granted[i].Load()
	}
	return out
}

// TestRedisStoreBatchesTargets: on a single node, concurrent Reserve calls
// for many targets share script runs, and each target is still decided on
// its own log: exactly its limit granted, exactly that many entries.
func TestRedisStoreBatchesTargets(t *testing.T) {
	counter := &scriptCounter{}
	client := redistest.StartServer(t).Client(t)
	client.AddHook(counter)
	s, err := NewRedisStore(client, WithKeyPrefix(redistest.KeyPrefix(t)))
	require.NoError(t, err)
	const targets, per = 40, 5
	lim := Limit{Limit: 3, Window: time.Minute}

	granted := reserveMany(t, s, lim, targets, per)
	for i, n := range granted {
		require.EqualValues(t, lim.Limit, n, "target %d", i)
		entries, err := client.ZCard(context.Background(), s.keys(fmt.Sprintf("t%d.example", i))[0]).Result()
		require.NoError(t, err)
		require.EqualValues(t, lim.Limit, entries, "target %d", i)
	}
	require.Less(t, counter.n.Load(), int64(targets*per), "concurrent calls for different targets must share script runs")
	require.Len(t, counter.slots, targets*lim.Limit, "every granted slot is in some run's reply")
}

// TestRedisStoreOnClusterModeNode: a plain client on a server in cluster
// mode (here one node holding every slot) refuses a script whose keys span
// slots; the store notices and decides each target alone from then on.
func TestRedisStoreOnClusterModeNode(t *testing.T) {
	srv := redistest.StartServer(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	client := srv.Client(t)
	ctx := context.Background()
	require.NoError(t, client.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", "0", "16383").Err())
	require.Eventually(t, func() bool {
		info, err := client.ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:ok")
	}, 10*time.Second, 20*time.Millisecond, "the one-node cluster never came up")
	s, err := NewRedisStore(client, WithKeyPrefix(redistest.KeyPrefix(t)))
	require.NoError(t, err)
	require.True(t, s.batch.Load(), "a plain client starts out batching")

	lim := Limit{Limit: 2, Window: time.Minute}
	for i, n := range reserveMany(t, s, lim, 20, 4) {
		require.EqualValues(t, lim.Limit, n, "target %d", i)
	}
	require.False(t, s.batch.Load(), "CROSSSLOT must turn batching off")
}

// TestRedisStoreBadReply: a reply that is not an array of integers, or too
// short, is an error wrapping ErrBadReply, not a panic or a wrong decision.
func TestRedisStoreBadReply(t *testing.T) {
	client := redistest.StartServer(t).Client(t)
	s, err := NewRedisStore(client)
	require.NoError(t, err)
	ctx := context.Background()
	for _, src := range []string{"return {1, 'x'}", "return 'x'", "return {1}", "return 7"} {
		_, err := s.eval(ctx, newScript(src), scriptArgs(0, 0), 2)
		require.ErrorIs(t, err, ErrBadReply, "script %q", src)
	}
	_, err = s.eval(ctx, newScript("return redis.error_reply('boom')"), scriptArgs(0, 0), 2)
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrBadReply, "a Redis error is not a bad reply")
	vals, err := s.eval(ctx, newScript("return {1, 2}"), scriptArgs(0, 0), 2)
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2}, vals)
}

// TestRedisStoreMarksItselfWhenTheHeartbeatIsLost: a process marks itself
// live once a second, but at once when Redis has lost the heartbeat set.
func TestRedisStoreMarksItselfWhenTheHeartbeatIsLost(t *testing.T) {
	client := redistest.StartServer(t).Client(t)
	s, err := NewRedisStore(client, WithKeyPrefix(redistest.KeyPrefix(t)))
	require.NoError(t, err)
	ctx := context.Background()
	lim := Limit{Limit: 100, Window: time.Minute}
	g := make([]Grant, 1)
	procs := s.keys("example.com")[2]
	for i := range 3 {
		st, err := s.Reserve(ctx, "example.com", lim, []Request{{ID: nextID(), N: 1}}, g)
		require.NoError(t, err)
		require.Equal(t, 1, st.Live, "call %d", i)
		members, err := client.ZRange(ctx, procs, 0, -1).Result()
		require.NoError(t, err)
		require.Equal(t, []string{s.Process()}, members, "call %d", i)
		ttl, err := client.PTTL(ctx, procs).Result()
		require.NoError(t, err)
		require.Greater(t, ttl, time.Duration(0), "call %d: the heartbeat set has a TTL", i)
		require.NoError(t, client.Del(ctx, procs).Err()) // as if Redis had lost it
	}
}

var _ redis.Hook = (*scriptCounter)(nil)

// TestRedisStoreQueuedCallIsNotEarly: a call that waited in the queue was
// sent later than the middle of the caller's round trip, which is where the
// caller puts the store's "now"; its durations grow by half the wait, so
// the caller never places a slot or a pause end before the store did (by
// more than half the run's own round trip, which the margin absorbs).
func TestRedisStoreQueuedCallIsNotEarly(t *testing.T) {
	client := redistest.StartServer(t).Client(t)
	s, err := NewRedisStore(client, WithKeyPrefix(redistest.KeyPrefix(t)))
	require.NoError(t, err)
	ctx := context.Background()
	lim := Limit{Limit: 1, Window: time.Minute}
	g := make([]Grant, 1)
	first := time.Now() // the first entry's slot is no earlier
	_, err = s.Reserve(ctx, "example.com", lim, []Request{{ID: nextID(), N: 1}}, g)
	require.NoError(t, err)
	paused := time.Now()
	_, err = s.Pause(ctx, "example.com", 30*time.Second)
	require.NoError(t, err)

	s.mu.Lock()
	s.inflight = storeLanes // every lane busy: the next call queues
	s.mu.Unlock()
	type result struct {
		st         State
		g          Grant
		start, end time.Time
		err        error
	}
	done := make(chan result, 1)
	go func() {
		g := make([]Grant, 1)
		start := time.Now()
		st, err := s.Reserve(ctx, "example.com", lim, []Request{{ID: nextID(), N: 1, MaxWait: -1}}, g)
		done <- result{st, g[0], start, time.Now(), err}
	}()
	require.Eventually(t, func() bool { s.mu.Lock(); defer s.mu.Unlock(); return len(s.queue) == 1 }, time.Second, time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	// A lane comes free and hands the queue on, as runBatches does.
	released := time.Now()
	s.mu.Lock()
	next := s.queue
	s.queue = nil
	s.mu.Unlock()
	next[0].lead = next
	close(next[0].ready)

	r := <-done
	require.NoError(t, r.err)
	require.True(t, r.g.OK)
	mid := r.start.Add(r.end.Sub(r.start) / 2) // where the caller puts the store's now
	slack := r.end.Sub(released)/2 + time.Millisecond
	require.False(t, mid.Add(r.g.Delay).Before(first.Add(time.Minute).Add(-slack)),
		"slot placed %v early", first.Add(time.Minute).Sub(mid.Add(r.g.Delay)))
	require.False(t, mid.Add(r.st.Paused).Before(paused.Add(30*time.Second).Add(-slack)),
		"pause end placed %v early", paused.Add(30*time.Second).Sub(mid.Add(r.st.Paused)))
	s.mu.Lock()
	require.Equal(t, storeLanes-1, s.inflight, "the handed-on lane is given back")
	s.inflight = 0
	s.mu.Unlock()
}
