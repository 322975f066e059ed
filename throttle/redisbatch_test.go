package throttle

import (
	"context"
	"fmt"
	"math/rand/v2"
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
	ageData(t, client, s)
	const targets, per = 40, 5
	lim := Limit{Limit: 3, Window: time.Minute}

	granted := reserveMany(t, s, lim, targets, per)
	for i, n := range granted {
		require.EqualValues(t, lim.Limit, n, "target %d", i)
		require.Len(t, logOf(t, client, s, fmt.Sprintf("t%d.example", i)), lim.Limit, "target %d", i)
	}
	require.Less(t, counter.n.Load(), int64(targets*per), "concurrent calls for different targets must share script runs")
	require.Len(t, counter.slots(""), targets*lim.Limit, "every granted slot is in some run's reply")
}

// clusterMode are redis-server arguments for a node in cluster mode.
var clusterMode = []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"}

// holdEverySlot makes the cluster-mode node behind client a cluster of its
// own, holding all 16384 slots, and waits until it says it is ok.
func holdEverySlot(t *testing.T, client *redis.Client) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, client.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", "0", "16383").Err())
	require.Eventually(t, func() bool {
		info, err := client.ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:ok")
	}, 10*time.Second, 20*time.Millisecond, "the one-node cluster never came up")
}

// TestRedisStoreOnClusterModeNode: a plain client on a server in cluster
// mode (here one node holding every slot) refuses a script whose keys span
// slots; the store notices and decides each target alone from then on.
func TestRedisStoreOnClusterModeNode(t *testing.T) {
	client := redistest.StartServer(t, clusterMode...).Client(t)
	holdEverySlot(t, client)
	s, err := NewRedisStore(client, WithKeyPrefix(redistest.KeyPrefix(t)))
	require.NoError(t, err)
	var targets []string
	for i := range 20 {
		targets = append(targets, fmt.Sprintf("t%d.example", i))
	}
	ageData(t, client, s, targets...)
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
	for _, src := range []string{"return {1, 'x'}", "return 'x'", "return {1}", "return 7",
		"return {1, false}", "return false", "return {1, {2}}", "return {1, '2'}"} {
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
// live on its first call for a target and then every quarter of the
// liveness; between marks
// it reads the count the latest mark stored, and leaves a set Redis has lost
// alone; but when Redis has lost the target's log too (a restart), the call
// marks at once.
func TestRedisStoreMarksItselfWhenTheHeartbeatIsLost(t *testing.T) {
	s, client := startStore(t)
	ctx := context.Background()
	lim := Limit{Limit: 100, Window: time.Minute}
	g := make([]Grant, 1)
	keys := s.keys("example.com")
	marked := func(call string) {
		t.Helper()
		members, err := client.ZRange(ctx, keys[2], 0, -1).Result()
		require.NoError(t, err)
		require.Equal(t, []string{s.Process()}, members, call)
		ttl, err := client.PTTL(ctx, keys[2]).Result()
		require.NoError(t, err)
		require.Greater(t, ttl, time.Duration(0), "%s: the heartbeat set has a TTL", call)
	}

	st, err := s.Reserve(ctx, "example.com", lim, oneUnit(), g)
	require.NoError(t, err)
	require.Equal(t, 1, st.Live, "the first call marks")
	marked("first call")

	require.NoError(t, client.Del(ctx, keys[2]).Err()) // Redis lost the set, not the log
	st, err = s.Reserve(ctx, "example.com", lim, oneUnit(), g)
	require.NoError(t, err)
	require.Equal(t, 1, st.Live, "no mark is due: the call reads the count of the last mark")
	n, err := client.Exists(ctx, keys[2]).Result()
	require.NoError(t, err)
	require.Zero(t, n, "no mark is due: the set is left alone")

	s.target("example.com").marked.Store(0) // a quarter of the liveness has passed
	st, err = s.Reserve(ctx, "example.com", lim, oneUnit(), g)
	require.NoError(t, err)
	require.Equal(t, 1, st.Live, "the next heartbeat marks again")
	marked("heartbeat")

	require.NoError(t, client.Del(ctx, keys...).Err()) // a restart: the log is gone too
	st, err = s.Reserve(ctx, "example.com", lim, oneUnit(), g)
	require.NoError(t, err)
	require.Equal(t, 1, st.Live, "a lost log marks at once")
	marked("after the lost log")
	require.Positive(t, st.Paused, "a lost log holds the target")
}

// TestHeartbeatEveryQuarterOfTheLiveness: after its first mark on a target
// a process marks again once a quarter of the liveness has passed, not
// before.
func TestHeartbeatEveryQuarterOfTheLiveness(t *testing.T) {
	const liveness = 10 * time.Second
	var rt redisTarget
	require.NotZero(t, rt.heartbeatDue(liveness, time.Now().UnixNano()), "the first call marks")
	rt.marked.Store(time.Now().Add(-2 * time.Second).UnixNano())
	require.Zero(t, rt.heartbeatDue(liveness, time.Now().UnixNano()), "2s after a mark, with 10s of liveness")
	rt.marked.Store(time.Now().Add(-2600 * time.Millisecond).UnixNano())
	require.NotZero(t, rt.heartbeatDue(liveness, time.Now().UnixNano()), "2.6s after a mark")
	rt.marked.Store(time.Now().Add(-600 * time.Millisecond).UnixNano())
	require.NotZero(t, rt.heartbeatDue(2*time.Second, time.Now().UnixNano()), "0.6s after a mark, with 2s of liveness")
}

// TestRedisStoreQueuedCallIsNotEarly: a call that waited in the queue was
// sent later than the middle of the caller's round trip, which is where the
// caller puts the store's "now"; its durations grow by half the wait, so
// the caller never places a slot or a pause end before the store did (by
// more than half the run's own round trip, which the margin absorbs).
func TestRedisStoreQueuedCallIsNotEarly(t *testing.T) {
	s, _ := startStore(t)
	ctx := context.Background()
	lim := Limit{Limit: 1, Window: time.Minute}
	g := make([]Grant, 1)
	first := time.Now() // the first entry's slot is no earlier
	_, err := s.Reserve(ctx, "example.com", lim, []Request{{ID: nextID(), N: 1}}, g)
	require.NoError(t, err)
	paused := time.Now()
	_, err = s.Pause(ctx, "example.com", 30*time.Second)
	require.NoError(t, err)

	s.calls.mu.Lock()
	s.calls.inflight = storeLanes // every lane busy: the next call queues
	s.calls.mu.Unlock()
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
	require.Eventually(t, func() bool { s.calls.mu.Lock(); defer s.calls.mu.Unlock(); return len(s.calls.queue) == 1 }, time.Second, time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	// A lane comes free and hands the queue on, as runBatches does.
	released := time.Now()
	s.calls.mu.Lock()
	next := s.calls.queue
	s.calls.queue = nil
	s.calls.mu.Unlock()
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
	s.calls.mu.Lock()
	require.Equal(t, storeLanes-1, s.calls.inflight, "the handed-on lane is given back")
	s.calls.inflight = 0
	s.calls.mu.Unlock()
}

// scriptHook runs before each script run (EVALSHA or EVAL) with the run's
// number, from 1, and its arguments.
type scriptHook struct {
	n      atomic.Int64
	before func(n int64, args []any)
}

func (h *scriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := strings.ToLower(cmd.Name()); name == "evalsha" || name == "eval" {
			h.before(h.n.Add(1), cmd.Args())
		}
		return next(ctx, cmd)
	}
}

// hookedStore returns a RedisStore on a fresh server whose script runs go
// through before, with the script loaded beforehand (no NOSCRIPT round).
func hookedStore(t *testing.T, before func(n int64, args []any), serverArgs ...string) (*RedisStore, *redis.Client) {
	t.Helper()
	client := redistest.StartServer(t, serverArgs...).Client(t)
	require.NoError(t, client.ScriptLoad(context.Background(), slidingLog.src).Err())
	s, err := NewRedisStore(client, WithKeyPrefix(redistest.KeyPrefix(t)))
	require.NoError(t, err)
	if len(serverArgs) == 0 { // a node in cluster mode takes keys once it holds the slots
		ageData(t, client, s)
	}
	client.AddHook(&scriptHook{before: before})
	return s, client
}

func oneUnit() []Request { return []Request{{ID: nextID(), N: 1}} }

func waitQueued(t *testing.T, s *RedisStore, n int) {
	t.Helper()
	require.Eventually(t, func() bool { s.calls.mu.Lock(); defer s.calls.mu.Unlock(); return len(s.calls.queue) == n }, 2*time.Second, time.Millisecond)
}

// busyStore returns a hooked RedisStore with every lane held by a run
// blocked on its gate (runs 1 and 2 wait for gates[0] and gates[1]); the
// hook calls third before the third run.
func busyStore(t *testing.T, third func()) (*RedisStore, [2]chan struct{}) {
	t.Helper()
	gates := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	s, _ := hookedStore(t, func(n int64, _ []any) {
		switch {
		case n <= 2:
			<-gates[n-1]
		case n == 3:
			third()
		}
	})
	for _, n := range []string{"lane1.example", "lane2.example"} {
		go func() {
			_, _ = s.Reserve(context.Background(), n, Limit{Limit: 10, Window: time.Minute}, oneUnit(), make([]Grant, 1))
		}()
	}
	require.Eventually(t, func() bool { s.calls.mu.Lock(); defer s.calls.mu.Unlock(); return s.calls.inflight == storeLanes }, 2*time.Second, time.Millisecond)
	return s, gates
}

// TestRedisStoreSharedRunOutlivesAnOldLeader: a run is bounded by the
// latest deadline of its calls, so a leader that spent most of its own in
// the queue does not fail the calls that joined it fresh.
func TestRedisStoreSharedRunOutlivesAnOldLeader(t *testing.T) {
	s, gates := busyStore(t, func() { time.Sleep(40 * time.Millisecond) }) // the shared run is slow
	lim := Limit{Limit: 10, Window: time.Minute}
	aCtx, cancelA := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancelA()
	go func() { _, _ = s.Reserve(aCtx, "a.example", lim, oneUnit(), make([]Grant, 1)) }()
	waitQueued(t, s, 1)
	time.Sleep(75 * time.Millisecond) // A has 25 ms left
	bCtx, cancelB := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancelB()
	bErr := make(chan error, 1)
	go func() { _, err := s.Reserve(bCtx, "b.example", lim, oneUnit(), make([]Grant, 1)); bErr <- err }()
	waitQueued(t, s, 2)
	close(gates[0]) // a lane frees: A leads the run of A and B
	err := <-bErr
	close(gates[1])
	require.NoError(t, err, "B had 100 ms; the shared run took 40")
}

// TestRedisStorePanicInASharedRunFreesEveryone: a run that panics fails the
// calls it carried and the queue, and gives its lane back; no caller waits
// forever (Throttler.runBatches does the same for its waiters).
func TestRedisStorePanicInASharedRunFreesEveryone(t *testing.T) {
	s, gates := busyStore(t, func() { panic("boom") })
	lim := Limit{Limit: 10, Window: time.Minute}
	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		_, _ = s.Reserve(context.Background(), "a.example", lim, oneUnit(), make([]Grant, 1))
	}()
	waitQueued(t, s, 1)
	bCtx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	bErr := make(chan error, 1)
	go func() { _, err := s.Reserve(bCtx, "b.example", lim, oneUnit(), make([]Grant, 1)); bErr <- err }()
	waitQueued(t, s, 2)
	close(gates[0])
	close(gates[1])
	select {
	case err := <-bErr:
		require.ErrorContains(t, err, "panicked")
	case <-time.After(5 * time.Second):
		t.Fatal("a caller of the run that panicked is still waiting")
	}
	require.Equal(t, "boom", <-panicked, "the panic goes on in the run's leader")
	require.Eventually(t, func() bool { s.calls.mu.Lock(); defer s.calls.mu.Unlock(); return s.calls.inflight == 0 }, 2*time.Second, time.Millisecond, "every lane is given back")
	_, err := s.Reserve(context.Background(), "c.example", lim, oneUnit(), make([]Grant, 1))
	require.NoError(t, err, "the store works on")
}

// TestRedisStoreLeaderIsNotEarly: the leader of a shared run, sent after a
// yield or (here) after a failed CROSSSLOT run, reports its durations as
// late as it was sent, like a call that queued.
func TestRedisStoreLeaderIsNotEarly(t *testing.T) {
	s, client := hookedStore(t, func(_ int64, args []any) {
		if k, _ := args[2].(int); k > 4 {
			time.Sleep(40 * time.Millisecond) // the run of several targets is slow, then refused
		}
	}, clusterMode...)
	holdEverySlot(t, client)
	ageData(t, client, s, "x.example", "q.example")
	ctx := context.Background()
	lim := Limit{Limit: 1, Window: time.Minute}
	g := make([]Grant, 1)
	first := time.Now() // the first entry's slot is no earlier
	_, err := s.Reserve(ctx, "x.example", lim, oneUnit(), g)
	require.NoError(t, err)
	// Its run, with the node's epoch key, met CROSSSLOT too: batching
	// again, the shared run below meets it.
	require.False(t, s.batch.Load())
	s.batch.Store(true)

	s.calls.mu.Lock()
	s.calls.inflight = storeLanes // the next call queues
	s.calls.mu.Unlock()
	go func() { _, _ = s.Reserve(ctx, "q.example", lim, oneUnit(), make([]Grant, 1)) }()
	waitQueued(t, s, 1)
	s.calls.mu.Lock()
	s.calls.inflight, s.calls.last = storeLanes-1, 2 // a lane frees; the last run was shared
	s.calls.mu.Unlock()
	start := time.Now()
	_, err = s.Reserve(ctx, "x.example", lim, []Request{{ID: nextID(), N: 1, MaxWait: -1}}, g)
	end := time.Now()
	require.NoError(t, err)
	require.False(t, s.batch.Load(), "the shared run met CROSSSLOT")
	mid := start.Add(end.Sub(start) / 2) // where the caller puts the store's now
	early := first.Add(time.Minute).Sub(mid.Add(g[0].Delay))
	require.Less(t, early, 2*time.Millisecond, "the leader's slot placed %v early", early)
}

// TestRedisStoreFailedCallMarksAgain: a run that fails does not count as
// this process's heartbeat: its next call marks it.
func TestRedisStoreFailedCallMarksAgain(t *testing.T) {
	client := redistest.StartServer(t).Client(t)
	prefix := redistest.KeyPrefix(t)
	s1, err := NewRedisStore(client, WithKeyPrefix(prefix))
	require.NoError(t, err)
	s2, err := NewRedisStore(client, WithKeyPrefix(prefix))
	require.NoError(t, err)
	ctx := context.Background()
	lim := Limit{Limit: 100, Window: time.Minute}
	g := make([]Grant, 1)
	_, err = s1.Reserve(ctx, "x.example", lim, oneUnit(), g)
	require.NoError(t, err)
	dead, cancel := context.WithCancel(ctx)
	cancel()
	_, err = s2.Reserve(dead, "x.example", lim, oneUnit(), g)
	require.ErrorIs(t, err, context.Canceled)
	st, err := s2.Reserve(ctx, "x.example", lim, oneUnit(), g)
	require.NoError(t, err)
	require.Equal(t, 2, st.Live, "after a failed first call")

	st, err = s1.Reserve(ctx, "x.example", lim, oneUnit(), g)
	require.NoError(t, err)
	require.Equal(t, 2, st.Live, "a call between marks counts both")
}

// TestRedisStoreRejectsBadLimits: a bad limit fails its own call before any
// run, so it cannot fail the other targets of a shared run.
func TestRedisStoreRejectsBadLimits(t *testing.T) {
	s, _ := startStore(t)
	for _, lim := range []Limit{{Limit: 0, Window: time.Second}, {Limit: 1, Window: 0}, {Limit: 1, Window: time.Second, Gap: -1}} {
		_, err := s.Reserve(context.Background(), "x.example", lim, oneUnit(), make([]Grant, 1))
		require.ErrorContains(t, err, "bad limit", "%+v", lim)
	}
}

// TestRedisStoreSharedRunDecidesAsAlone: a run deciding several calls, some
// on the same target, grants exactly what runs of one call each would have
// granted, in the same order (a randomized comparison at a fixed server
// time).
func TestRedisStoreSharedRunDecidesAsAlone(t *testing.T) {
	client := redistest.StartServer(t).Client(t)
	prefix := redistest.KeyPrefix(t)
	for round := range 100 {
		rng := rand.New(rand.NewPCG(uint64(round), 1))
		now := int64(1_800_000_000_000_000) + int64(round)*1e9
		shared, err := NewRedisStore(client, WithKeyPrefix(fmt.Sprintf("%sa%d:", prefix, round)))
		require.NoError(t, err)
		alone, err := NewRedisStore(client, WithKeyPrefix(fmt.Sprintf("%sb%d:", prefix, round)))
		require.NoError(t, err)
		alone.proc, alone.procArg, alone.procNum = shared.proc, shared.procArg, shared.procNum
		shared.now = func() int64 { return now }
		alone.now = shared.now
		for range 6 {
			var a, b []*reserveCall
			for range 1 + rng.IntN(5) {
				tgt := fmt.Sprintf("t%d", rng.IntN(3))
				lim := Limit{Limit: 1 + rng.IntN(5), Window: time.Duration(1+rng.IntN(5)) * time.Second, Gap: time.Duration(rng.IntN(3)) * 100 * time.Millisecond}
				var reqs []Request
				for range 1 + rng.IntN(4) {
					reqs = append(reqs, Request{ID: nextID(), N: 1 + rng.IntN(lim.Limit+1), MaxWait: time.Duration(rng.IntN(4)-1) * time.Second})
				}
				a = append(a, &reserveCall{ctx: context.Background(), rt: shared.target(tgt), target: tgt, lim: lim, reqs: reqs, grants: make([]Grant, len(reqs))})
				b = append(b, &reserveCall{ctx: context.Background(), rt: alone.target(tgt), target: tgt, lim: lim, reqs: reqs, grants: make([]Grant, len(reqs))})
			}
			shared.reserve(a)
			for _, c := range b {
				alone.reserve([]*reserveCall{c})
			}
			for i := range a {
				require.NoError(t, a[i].err)
				require.NoError(t, b[i].err)
				require.Equal(t, b[i].grants, a[i].grants, "round %d call %d", round, i)
				a[i].state.Live, b[i].state.Live, a[i].state.Place, b[i].state.Place = 0, 0, 0, 0 // each store's own heartbeat
				require.Equal(t, b[i].state, a[i].state, "round %d call %d", round, i)
			}
			now += int64(rng.IntN(2000)) * 1000
		}
	}
}

// TestRedisStoreTargetTwiceInARun: when one run carries two calls for one
// target (two Throttlers on one store), the second sees what the first
// wrote to the target's pause key: a pause set because the log was lost
// survives the second call's heartbeat.
func TestRedisStoreTargetTwiceInARun(t *testing.T) {
	const now = int64(1_800_000_000_000_000)
	s, client := fixedClockStore(t, now)
	ctx := context.Background()
	lim := Limit{Limit: 5, Window: 10 * time.Second}
	rt := s.target("x.example")
	rt.seen.Store((now - time.Second.Microseconds()) << 2) // this process saw an entry a second ago; Redis has none
	var calls []*reserveCall
	for range 2 {
		reqs := []Request{{ID: nextID(), N: 1, MaxWait: -1}} // booked at the pause's end
		calls = append(calls, &reserveCall{ctx: ctx, rt: rt, target: "x.example", lim: lim, reqs: reqs, grants: make([]Grant, 1)})
	}
	s.reserve(calls)
	for i, c := range calls {
		require.NoError(t, c.err)
		// Until a window after any slot booked before the loss: a horizon
		// (a window, by default) and a window.
		require.Equal(t, []Grant{{OK: true, Delay: 20 * time.Second}}, c.grants, "call %d", i)
		require.Equal(t, 20*time.Second, c.state.Paused, "call %d: the lost log holds the target", i)
	}
	m := readMeta(t, client, s, "x.example")
	require.Equal(t, now+20_000_000, m.pause, "the pause key keeps the pause")
	require.Len(t, m.entries, 2, "both calls' slots, inline")
	// The inline log's TTL, meta's, ends a window past its last slot (the
	// pause's end), and three spares of 5 s (half the window) more, or
	// later: meta keeps the live count for the heartbeat's liveness.
	require.GreaterOrEqual(t, m.metaExpires, now+45_000_000, "the pause key keeps its expiry, and the inline log's")
}

// TestRedisStoreSharedRunSkipsEndedCalls: calls of a shared run whose
// context ended before it was sent get their context's error and book
// nothing; the rest of the run is decided as usual, and the caller's batch
// is left as it was (its order tells which callers to wake).
func TestRedisStoreSharedRunSkipsEndedCalls(t *testing.T) {
	const now = int64(1_800_000_000_000_000)
	s, client := fixedClockStore(t, now)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	lim := Limit{Limit: 5, Window: 10 * time.Second}
	for _, endedAt := range [][]bool{{true, false, false}, {false, true, false}, {false, false, true}, {true, true, true}} {
		var calls []*reserveCall
		tgt := fmt.Sprintf("skip%v.example", endedAt)
		for _, e := range endedAt {
			ctx := context.Background()
			if e {
				ctx = ended
			}
			calls = append(calls, &reserveCall{ctx: ctx, rt: s.target(tgt), target: tgt, lim: lim, reqs: []Request{{ID: nextID(), N: 1}}, grants: make([]Grant, 1)})
		}
		batch := append([]*reserveCall(nil), calls...)
		s.reserve(batch)
		require.Equal(t, calls, batch, "%v: the caller's batch is left as it was", endedAt)
		live := 0
		for i, c := range calls {
			if endedAt[i] {
				require.ErrorIs(t, c.err, context.Canceled, "%v: call %d", endedAt, i)
				require.Equal(t, Grant{}, c.grants[0], "%v: call %d", endedAt, i)
				continue
			}
			live++
			require.NoError(t, c.err, "%v: call %d", endedAt, i)
			require.Equal(t, Grant{OK: true}, c.grants[0], "%v: call %d", endedAt, i)
			require.Equal(t, 5-live, c.state.Remaining, "%v: call %d", endedAt, i)
		}
		require.Len(t, readMeta(t, client, s, tgt).entries, live, "%v: only the live calls booked", endedAt)
	}
}
