package throttle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

func newTestThrottler(t *testing.T, opts ...Option) *Throttler {
	t.Helper()
	rules, err := ParseRules("*=2/1s", "one.example=1/1s", "paced.example=10/1s,gap=100ms")
	require.NoError(t, err)
	tr, err := New(rules, append([]Option{WithMargin(0)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { tr.Close() }) // a test's own Close comes first: Close again does nothing
	return tr
}

// textLogger logs text lines to w without their time, nor the other keys
// given, so that a test can compare them whole.
func textLogger(w io.Writer, drop ...string) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || slices.Contains(drop, a.Key) {
				return slog.Attr{}
			}
			return a
		}}))
}

func TestWaitBlocksUntilTheWindowAllows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestThrottler(t)
		defer tr.Close()
		ctx := context.Background()
		start := time.Now()
		var got []time.Duration
		for range 5 {
			require.NoError(t, tr.Wait(ctx, "example.com"))
			got = append(got, time.Since(start))
		}
		require.Equal(t, []time.Duration{0, 0, time.Second, time.Second, 2 * time.Second}, got)
	})
}

func TestMarginWidensTheWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestThrottler(t, WithMargin(250*time.Millisecond))
		defer tr.Close()
		start := time.Now()
		for range 3 {
			require.NoError(t, tr.Wait(context.Background(), "example.com"))
		}
		require.Equal(t, 1250*time.Millisecond, time.Since(start))
	})
}

func TestCancelledWaitReleasesItsSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestThrottler(t)
		defer tr.Close()
		ctx := context.Background()
		require.NoError(t, tr.Wait(ctx, "one.example")) // the window is full until 1s

		cctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { errc <- tr.Wait(cctx, "one.example") }() // books 1s
		synctest.Wait()
		cancel()
		err := <-errc
		require.ErrorIs(t, err, context.Canceled)

		start := time.Now()
		require.NoError(t, tr.Wait(ctx, "one.example"))
		require.Equal(t, time.Second, time.Since(start), "the next waiter takes the released slot, not the one after it")
	})
}

func TestDeadlineTooShortFailsFastAndWritesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestThrottler(t)
		defer tr.Close()
		ctx := context.Background()
		require.NoError(t, tr.Wait(ctx, "one.example"))

		dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := tr.Wait(dctx, "one.example")
		require.Equal(t, time.Duration(0), time.Since(start), "must not wait for a slot it cannot use")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorIs(t, err, ErrWouldExceedDeadline)

		d, err := tr.Allow(ctx, "one.example")
		require.NoError(t, err)
		require.Equal(t, Decision{RetryAfter: time.Second, ResetAfter: time.Second}, d, "the refused wait must have booked nothing")
	})
}

func TestPauseHoldsEveryWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestThrottler(t)
		defer tr.Close()
		ctx := context.Background()
		left, err := tr.Pause(ctx, "example.com", 2*time.Second)
		require.NoError(t, err)
		require.Equal(t, 2*time.Second, left)

		start := time.Now()
		var wg sync.WaitGroup
		var mu sync.Mutex
		var woke []time.Duration
		for range 4 {
			wg.Go(func() {
				require.NoError(t, tr.Wait(ctx, "example.com"))
				mu.Lock()
				woke = append(woke, time.Since(start))
				mu.Unlock()
			})
		}
		wg.Wait()
		require.ElementsMatch(t, []time.Duration{2 * time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second}, woke)

		left, err = tr.Paused(ctx, "example.com")
		require.NoError(t, err)
		require.Equal(t, time.Duration(0), left)
	})
}

// TestEachProcessLogsAPauseOnce: a fleet-wide pause is logged once by the
// process that set it, however many times it is set (a burst of 429s), and
// once by each process it holds, however it learns of it (a decision, or a
// check of the pause before a booked slot), and again when it is extended,
// so that no process of the fleet seems to hang.
func TestEachProcessLogsAPauseOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &flakyStore{MemoryStore: NewMemoryStore()} // a Store shared as Redis is, not the one-process fast path
		defer store.Close()
		const msg = "paused for the whole fleet"
		setterLogs, heldLogs, checkerLogs := &logRecorder{}, &logRecorder{}, &logRecorder{}
		setter := newTestThrottler(t, WithStore(store), WithLogger(slog.New(setterLogs)))
		held := newTestThrottler(t, WithStore(store), WithLogger(slog.New(heldLogs)))
		checker := newTestThrottler(t, WithStore(store), WithLogger(slog.New(checkerLogs)))
		ctx := context.Background()

		for range 5 { // a burst of 429s, each asking for the pause
			_, err := setter.Pause(ctx, "example.com", 2*time.Second)
			require.NoError(t, err)
			time.Sleep(time.Millisecond)
		}
		d, err := setter.Allow(ctx, "example.com")
		require.NoError(t, err)
		require.False(t, d.Allowed)
		require.Equal(t, []string{msg + " example.com 2s this process"}, setterLogs.pauses(), "once, by the setter")

		for range 3 {
			d, err := held.Allow(ctx, "example.com")
			require.NoError(t, err)
			require.False(t, d.Allowed)
		}
		require.NoError(t, held.Wait(ctx, "example.com"))
		require.Len(t, heldLogs.pauses(), 1, "once for the pause: %q", heldLogs.msgs)
		require.Contains(t, heldLogs.pauses()[0], " another process")

		_, err = setter.Pause(ctx, "example.com", time.Minute)
		require.NoError(t, err)
		left, err := checker.Paused(ctx, "example.com") // as the transport checks before a booked slot
		require.NoError(t, err)
		require.Equal(t, time.Minute, left)
		_, err = checker.Allow(ctx, "example.com")
		require.NoError(t, err)
		require.Equal(t, []string{msg + " example.com 1m0s another process"}, checkerLogs.pauses(), "learned from a check of the pause")
		_, err = held.Allow(ctx, "example.com")
		require.NoError(t, err)
		require.Len(t, heldLogs.pauses(), 2, "again once extended: %q", heldLogs.msgs)
		require.Len(t, setterLogs.pauses(), 2, "the setter's extension: %q", setterLogs.msgs)

		time.Sleep(2 * time.Minute)
		_, err = setter.Pause(ctx, "example.com", time.Second) // a new pause
		require.NoError(t, err)
		_, err = held.Allow(ctx, "example.com")
		require.NoError(t, err)
		require.Len(t, heldLogs.pauses(), 3, "a new pause: %q", heldLogs.msgs)
		require.Len(t, checkerLogs.pauses(), 1, "a process that met no new pause says nothing: %q", checkerLogs.msgs)
	})
}

func TestPauseIsCapped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestThrottler(t, WithMaxPause(time.Minute))
		defer tr.Close()
		left, err := tr.Pause(context.Background(), "example.com", 1000*time.Hour)
		require.NoError(t, err)
		require.Equal(t, time.Minute, left)
	})
}

func TestPacing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestThrottler(t)
		defer tr.Close()
		start := time.Now()
		for i := range 3 {
			require.NoError(t, tr.Wait(context.Background(), "paced.example"))
			require.Equal(t, time.Duration(i)*100*time.Millisecond, time.Since(start))
		}
	})
}

func TestAllowDecisions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestThrottler(t)
		defer tr.Close()
		ctx := context.Background()
		d, err := tr.Allow(ctx, "Example.com:443")
		require.NoError(t, err)
		require.Equal(t, Decision{Allowed: true, Remaining: 1, ResetAfter: time.Second}, d)
		time.Sleep(300 * time.Millisecond)
		d, err = tr.AllowN(ctx, "example.com", 2)
		require.NoError(t, err)
		require.Equal(t, Decision{RetryAfter: 700 * time.Millisecond, Remaining: 1, ResetAfter: 700 * time.Millisecond}, d)
		d, err = tr.Allow(ctx, "example.com")
		require.NoError(t, err)
		require.True(t, d.Allowed)
	})
}

func TestErrors(t *testing.T) {
	rules, err := ParseRules("only.example=2/1s")
	require.NoError(t, err)
	tr, err := New(rules)
	require.NoError(t, err)
	defer tr.Close()
	ctx := context.Background()

	require.ErrorIs(t, tr.Wait(ctx, "other.example"), ErrNoRule)
	require.ErrorIs(t, tr.Wait(ctx, "bad host"), ErrBadTarget)
	require.ErrorIs(t, tr.WaitN(ctx, "only.example", 3), ErrTooMany)
	for _, n := range []int{0, -1} {
		err := tr.WaitN(ctx, "only.example", n)
		require.ErrorContains(t, err, fmt.Sprintf(`"only.example": %d units: want at least 1`, n))
		require.NotErrorIs(t, err, ErrTooMany, "not more than the limit")
		_, err = tr.AllowN(ctx, "only.example", n)
		require.ErrorContains(t, err, "want at least 1")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, tr.Wait(cctx, "only.example"), context.Canceled)
	require.NoError(t, tr.Close())
	require.ErrorIs(t, tr.Wait(ctx, "only.example"), ErrClosed)
	_, _, err = tr.Target(ctx, "only.example")
	require.ErrorIs(t, err, ErrClosed)

	_, err = New(nil)
	require.Error(t, err)
	_, err = New(rules, WithMargin(-time.Second))
	require.ErrorContains(t, err, "margin")
	// A window plus this margin overflows a Duration: refused, not a
	// negative window that admits everything.
	_, err = New(rules, WithMargin(math.MaxInt64-time.Hour))
	require.ErrorContains(t, err, "margin")
	_, err = New(rules, WithMaxPause(math.MaxInt64))
	require.ErrorContains(t, err, "max pause")
	_, err = New(rules, WithMaxAhead(math.MaxInt64))
	require.ErrorContains(t, err, "max ahead")
	_, err = New(rules, WithStoreTimeout(0))
	require.ErrorContains(t, err, "store timeout")
}

func TestKeyModes(t *testing.T) {
	rules, err := ParseRules("*=5/1s", "*.example.co.uk=7/1s")
	require.NoError(t, err)
	tr, err := New(rules, WithKeyMode(ByDomain))
	require.NoError(t, err)
	defer tr.Close()
	name, rule, err := tr.Target(context.Background(), "WWW.api.Example.co.uk:8443")
	require.NoError(t, err)
	require.Equal(t, "example.co.uk", name)
	require.Equal(t, 7, rule.Limit, "a wildcard for the host applies to its group")

	_, err = New(rules, WithKeyMode(ByIP))
	require.ErrorIs(t, err, ErrBadRule)
	require.ErrorContains(t, err, `"*.example.co.uk" cannot apply with key mode ip`)
	ipRules, err := ParseRules("*=5/1s", "127.0.0.1=3/1s", "::1=3/1s")
	require.NoError(t, err)
	tr2, err := New(ipRules, WithKeyMode(ByIP))
	require.NoError(t, err)
	defer tr2.Close()
	name, rule, err = tr2.Target(context.Background(), "localhost")
	require.NoError(t, err)
	require.Equal(t, 3, rule.Limit, "the address's rule")
	require.Contains(t, []string{"127.0.0.1", "::1"}, name)
}

// flakyStore is a MemoryStore whose calls fail while fail is set, and that
// counts its Reserve calls.
type flakyStore struct {
	*MemoryStore
	fail     atomic.Bool
	failOnly string // when set, fail fails only this target's calls
	latency  time.Duration
	live     int // the live count it reports; 0 means 2
	place    int // the place it reports (0: none)
	reserves atomic.Int64
	restored atomic.Int64
}

var errFlaky = errors.New("store down")

func (s *flakyStore) Reserve(ctx context.Context, target string, lim Limit, reqs []Request, grants []Grant) (State, error) {
	s.reserves.Add(1)
	time.Sleep(s.latency)
	if s.fail.Load() && (s.failOnly == "" || s.failOnly == target) {
		return State{}, errFlaky
	}
	st, err := s.MemoryStore.Reserve(ctx, target, lim, reqs, grants)
	st.Live = 2 // as if a second process shared the target
	if s.live > 0 {
		st.Live = s.live
	}
	st.Place = s.place
	return st, err
}

func (s *flakyStore) Restore(ctx context.Context, target string, window time.Duration, entries []Entry) error {
	if s.fail.Load() {
		return errFlaky
	}
	for _, e := range entries {
		s.restored.Add(int64(e.N))
	}
	return s.MemoryStore.Restore(ctx, target, window, entries)
}

func (s *flakyStore) Pause(ctx context.Context, target string, d time.Duration) (time.Duration, error) {
	if s.fail.Load() {
		return 0, errFlaky
	}
	return s.MemoryStore.Pause(ctx, target, d)
}

func TestConcurrentWaitersShareStoreCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &flakyStore{MemoryStore: NewMemoryStore(), latency: time.Millisecond}
		defer store.Close()
		rules, err := ParseRules("*=50/1s")
		require.NoError(t, err)
		tr, err := New(rules, WithStore(store), WithMargin(0))
		require.NoError(t, err)
		defer tr.Close()
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 25 {
					require.NoError(t, tr.Wait(context.Background(), "example.com"))
				}
			})
		}
		wg.Wait()
		require.Less(t, store.reserves.Load(), int64(100), "8 waiters × 25 admissions must share calls")
	})
}

// TestFallbackIsLoggedOncePerProcess: an outage over several targets is one
// line when it begins, naming the first target that failed, and one when
// it ends, naming the first target back and how long the fallback lasted.
func TestFallbackIsLoggedOncePerProcess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &flakyStore{MemoryStore: NewMemoryStore()}
		defer store.Close()
		var logged strings.Builder
		rules, err := ParseRules("*=100/1s")
		require.NoError(t, err)
		tr, err := New(rules, WithStore(store), WithFailurePolicy(FailOpen),
			WithLogger(textLogger(&logged)))
		require.NoError(t, err)
		defer tr.Close()
		ctx := context.Background()
		store.fail.Store(true)
		for _, host := range []string{"a.example", "b.example", "a.example"} {
			require.NoError(t, tr.Wait(ctx, host))
		}
		time.Sleep(3 * time.Second)
		store.fail.Store(false)
		for _, host := range []string{"a.example", "b.example"} {
			require.NoError(t, tr.Wait(ctx, host))
		}
		require.Equal(t, ModeStore, tr.Mode())
		require.Equal(t,
			"level=WARN msg=\"fleetgate: store failed; deciding by the failure policy\" policy=open first_target=a.example error=\"store down\"\n"+
				"level=INFO msg=\"fleetgate: store is back; deciding by the store again\" first_target=a.example after=3s\n",
			logged.String())
	})
}

// hungStore is a MemoryStore whose Reserve never answers: it returns when
// its context ends, with the context's error, as go-redis does.
type hungStore struct{ *MemoryStore }

func (s hungStore) Reserve(ctx context.Context, _ string, _ Limit, _ []Request, _ []Grant) (State, error) {
	<-ctx.Done()
	return State{}, ctx.Err()
}

// TestAStoreTimeoutIsNamed: a store that does not answer (a killed Redis,
// most often) is logged with the timeout it ran out of, not only
// "context deadline exceeded": the store timeout, or for a call of many
// units the longer one it had.
func TestAStoreTimeoutIsNamed(t *testing.T) {
	for _, tc := range []struct {
		units int
		named string
	}{
		{1, "no answer within the store timeout (30ms): context deadline exceeded"},
		{1_001, "no answer within 50ms, the store timeout and 20µs for each of 1000 units past the first: context deadline exceeded"},
	} {
		synctest.Test(t, func(t *testing.T) {
			store := hungStore{NewMemoryStore()}
			defer store.Close()
			var logged strings.Builder
			rules, err := ParseRules("*=10000/1s")
			require.NoError(t, err)
			tr, err := New(rules, WithStore(store), WithFailurePolicy(FailOpen), WithStoreTimeout(30*time.Millisecond),
				WithLogger(textLogger(&logged)))
			require.NoError(t, err)
			defer tr.Close()
			require.NoError(t, tr.WaitN(context.Background(), "a.example", tc.units))
			require.Equal(t,
				"level=WARN msg=\"fleetgate: store failed; deciding by the failure policy\" policy=open first_target=a.example error=\""+tc.named+"\"\n",
				logged.String())
		})
	}
}

// TestEveryTargetIsBackOnceTheStoreIs: once one target has found the store
// back, every other target the store failed for is decided by it again at
// its next call (ModeStore's promise), not at the end of its own probe
// interval. Under FailOpen, a target that fell back after the first went
// on admitting everything while Mode said store.
func TestEveryTargetIsBackOnceTheStoreIs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &flakyStore{MemoryStore: NewMemoryStore()}
		defer store.Close()
		rules, err := ParseRules("*=5/1s")
		require.NoError(t, err)
		tr, err := New(rules, WithStore(store), WithFailurePolicy(FailOpen), WithLogger(quietLogger()))
		require.NoError(t, err)
		defer tr.Close()
		ctx := context.Background()

		store.fail.Store(true)
		d, err := tr.Allow(ctx, "a.example")
		require.NoError(t, err)
		require.True(t, d.Allowed, "open")
		time.Sleep(DefaultProbeInterval / 2)
		_, err = tr.Allow(ctx, "b.example")
		require.NoError(t, err)
		require.Equal(t, ModeFallback, tr.Mode())

		time.Sleep(DefaultProbeInterval / 2)
		store.fail.Store(false)
		_, err = tr.Allow(ctx, "a.example")
		require.NoError(t, err)
		require.Equal(t, ModeStore, tr.Mode(), "a.example found the store back")

		calls := store.reserves.Load()
		for i := range 6 {
			d, err := tr.Allow(ctx, "b.example")
			require.NoError(t, err)
			require.Equal(t, i < 5, d.Allowed, "decision %d on b.example: the store's limit of 5", i)
		}
		require.Equal(t, calls+6, store.reserves.Load(), "every decision on b.example came from the store")
	})
}

// openOnFlaky returns a Throttler under FailOpen on a flakyStore, with
// the rule *=100/1s, logging to the returned buffer as text; both are
// closed at the end of the test.
func openOnFlaky(t *testing.T) (*Throttler, *flakyStore, *strings.Builder) {
	store := &flakyStore{MemoryStore: NewMemoryStore()}
	t.Cleanup(func() { store.Close() })
	buf := &strings.Builder{}
	rules, err := ParseRules("*=100/1s")
	require.NoError(t, err)
	tr, err := New(rules, WithStore(store), WithFailurePolicy(FailOpen), WithLogger(textLogger(&lockedWriter{w: buf})))
	require.NoError(t, err)
	t.Cleanup(func() { tr.Close() })
	return tr, store, buf
}

// TestAnOutageEndsWithTheFirstTargetBack: a target the store failed for
// and that is not called again does not keep the Throttler in fallback
// once the store is back: Mode, and the log, follow the store, and a
// second outage is logged again. Under FailOpen the idle target has no
// booking to replay, and is forgotten as any other.
func TestAnOutageEndsWithTheFirstTargetBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, store, buf := openOnFlaky(t)
		ctx := context.Background()
		store.fail.Store(true)
		require.NoError(t, tr.Wait(ctx, "a.example"))
		require.NoError(t, tr.Wait(ctx, "idle.example")) // never called again
		require.Equal(t, ModeFallback, tr.Mode())
		time.Sleep(2 * time.Second)
		store.fail.Store(false)
		require.NoError(t, tr.Wait(ctx, "a.example"))
		require.Equal(t, ModeStore, tr.Mode(), "the store is back, whatever the idle target")

		time.Sleep(time.Second)
		store.fail.Store(true)
		require.NoError(t, tr.Wait(ctx, "a.example"))
		require.Equal(t, ModeFallback, tr.Mode(), "a second outage")
		time.Sleep(2 * time.Second)
		store.fail.Store(false)
		require.NoError(t, tr.Wait(ctx, "a.example"))
		require.Equal(t, ModeStore, tr.Mode())
		require.Equal(t,
			"level=WARN msg=\"fleetgate: store failed; deciding by the failure policy\" policy=open first_target=a.example error=\"store down\"\n"+
				"level=INFO msg=\"fleetgate: store is back; deciding by the store again\" first_target=a.example after=2s\n"+
				"level=WARN msg=\"fleetgate: store failed; deciding by the failure policy\" policy=open first_target=a.example error=\"store down\"\n"+
				"level=INFO msg=\"fleetgate: store is back; deciding by the store again\" first_target=a.example after=2s\n",
			buf.String())

		_, ok := tr.targets.Load("idle.example")
		require.True(t, ok)
		tr.forget()
		_, ok = tr.targets.Load("idle.example")
		require.False(t, ok, "under FailOpen, no booking to replay: forgotten as any other")
	})
}

// TestForgetKeepsALocalFallbackWhileItsBookingsCount: under FailLocal, a
// target the store failed for and that is not called again holds this
// process's local bookings, replayed at its next call: it is kept until
// the store has been back long enough that no process's fallback booking
// can be left in its window.
func TestForgetKeepsALocalFallbackWhileItsBookingsCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &flakyStore{MemoryStore: NewMemoryStore()}
		defer store.Close()
		rules, err := ParseRules("*=100/1s")
		require.NoError(t, err)
		tr, err := New(rules, WithStore(store), WithLogger(slog.New(slog.DiscardHandler)))
		require.NoError(t, err)
		defer tr.Close()
		ctx := context.Background()
		require.NoError(t, tr.Wait(ctx, "idle.example")) // the store's count: a share
		require.NoError(t, tr.Wait(ctx, "a.example"))
		time.Sleep(time.Minute) // joined long enough ago for a share (half the liveness)
		require.NoError(t, tr.Wait(ctx, "idle.example"))
		require.NoError(t, tr.Wait(ctx, "a.example"))
		store.fail.Store(true)
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second) // a share, or it would wait for the store
		defer cancel()
		require.NoError(t, tr.Wait(wctx, "idle.example")) // a local booking, never replayed
		require.NoError(t, tr.Wait(wctx, "a.example"))
		require.Equal(t, ModeFallback, tr.Mode())
		time.Sleep(time.Second)
		store.fail.Store(false)
		require.NoError(t, tr.Wait(ctx, "a.example"))
		require.Equal(t, ModeStore, tr.Mode())

		tr.forget()
		_, ok := tr.targets.Load("idle.example")
		require.True(t, ok, "kept while a fallback booking may be left in its window")
		time.Sleep(DefaultProbeInterval + DefaultRecoveryGrace + time.Second + DefaultMargin + time.Millisecond)
		tr.forget()
		_, ok = tr.targets.Load("idle.example")
		require.False(t, ok, "forgotten once none can be")
	})
}

// TestATargetNeverFailedForEndsTheOutage: once the store is back, a target
// it never failed for (a host first seen since) ends the outage, in Mode
// and in the log, when no store call has failed for a probe interval:
// targets the store failed for and that are not called again do not keep
// the Throttler in fallback. While some target still fails, one that
// answers does not end it.
func TestATargetNeverFailedForEndsTheOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, store, buf := openOnFlaky(t)
		ctx := context.Background()
		store.failOnly = "old.example"
		store.fail.Store(true)
		require.NoError(t, tr.Wait(ctx, "old.example")) // never called again once the store is back
		require.Equal(t, ModeFallback, tr.Mode())
		require.NoError(t, tr.Wait(ctx, "new1.example"))
		require.Equal(t, ModeFallback, tr.Mode(), "old.example failed a moment ago")

		time.Sleep(time.Second)
		store.fail.Store(false)
		require.NoError(t, tr.Wait(ctx, "new2.example"))
		require.Equal(t, ModeStore, tr.Mode())
		require.Equal(t,
			"level=WARN msg=\"fleetgate: store failed; deciding by the failure policy\" policy=open first_target=old.example error=\"store down\"\n"+
				"level=INFO msg=\"fleetgate: store is back; deciding by the store again\" first_target=new2.example after=1s\n",
			buf.String())
	})
}

func TestFailurePolicies(t *testing.T) {
	rules, err := ParseRules("*=4/1s")
	require.NoError(t, err)

	t.Run("open admits", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := &flakyStore{MemoryStore: NewMemoryStore()}
			defer store.Close()
			store.fail.Store(true)
			tr, err := New(rules, WithStore(store), WithFailurePolicy(FailOpen))
			require.NoError(t, err)
			defer tr.Close()
			start := time.Now()
			for range 10 {
				require.NoError(t, tr.Wait(context.Background(), "example.com"))
			}
			require.Equal(t, time.Duration(0), time.Since(start))
			require.Equal(t, ModeFallback, tr.Mode())
		})
	})

	t.Run("closed waits for the store", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := &flakyStore{MemoryStore: NewMemoryStore()}
			defer store.Close()
			store.fail.Store(true)
			tr, err := New(rules, WithStore(store), WithFailurePolicy(FailClosed))
			require.NoError(t, err)
			defer tr.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			err = tr.Wait(ctx, "example.com")
			require.ErrorIs(t, err, ErrStoreUnavailable)
			require.ErrorIs(t, err, context.DeadlineExceeded)

			// Cancelled with a cause: both match.
			errShutdown := errors.New("shutting down")
			cctx, ccancel := context.WithCancelCause(context.Background())
			time.AfterFunc(500*time.Millisecond, func() { ccancel(errShutdown) })
			err = tr.Wait(cctx, "example.com")
			require.ErrorIs(t, err, ErrStoreUnavailable)
			require.ErrorIs(t, err, context.Canceled)
			require.ErrorIs(t, err, errShutdown)

			go func() {
				time.Sleep(500 * time.Millisecond)
				store.fail.Store(false)
			}()
			start := time.Now()
			require.NoError(t, tr.Wait(context.Background(), "example.com"))
			require.GreaterOrEqual(t, time.Since(start), 500*time.Millisecond)
			require.Equal(t, ModeStore, tr.Mode())
		})
	})

	t.Run("local waits when it never learned the fleet's size", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := &flakyStore{MemoryStore: NewMemoryStore()}
			defer store.Close()
			store.fail.Store(true)
			tr, err := New(rules, WithStore(store), WithLogger(quietLogger()))
			require.NoError(t, err)
			defer tr.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			require.ErrorIs(t, tr.Wait(ctx, "example.com"), ErrStoreUnavailable)
			d, err := tr.Allow(context.Background(), "example.com")
			require.ErrorIs(t, err, ErrStoreUnavailable)
			require.False(t, d.Allowed)
		})
	})

	t.Run("local keeps the share and a full window across the transitions", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := &flakyStore{MemoryStore: NewMemoryStore()}
			defer store.Close()
			tr, err := New(rules, WithStore(store), WithMargin(0), WithRecoveryGrace(0))
			require.NoError(t, err)
			defer tr.Close()
			ctx := context.Background()
			// Join the fleet two horizons before the run: a newer member
			// gets no share, as the others may not have counted it.
			_, err = tr.Allow(ctx, "example.com")
			require.NoError(t, err)
			tg, err := tr.target(ctx, "example.com")
			require.NoError(t, err)
			time.Sleep(tr.shareSpan(tg))
			start := time.Now()
			var admitted []time.Duration
			wait := func() {
				require.NoError(t, tr.Wait(ctx, "example.com"))
				admitted = append(admitted, time.Since(start))
			}
			for range 5 { // 4 now, one booked at 1s
				wait()
			}
			store.fail.Store(true)
			for range 4 {
				wait()
			}
			require.Equal(t, ModeFallback, tr.Mode())
			// Two live processes: the share is 2 per window, and the first
			// local admission waits a full window past the horizon (one
			// window), the furthest any process could have booked.
			require.Equal(t, []time.Duration{0, 0, 0, 0, time.Second, 3 * time.Second, 3 * time.Second, 4 * time.Second, 4 * time.Second}, admitted)

			store.fail.Store(false)
			time.Sleep(DefaultProbeInterval)
			wait()
			require.Equal(t, ModeStore, tr.Mode())
			require.GreaterOrEqual(t, store.restored.Load(), int64(2+1), "local admissions and placeholders are replayed into the store")
		})
	})
}

func TestMemoryStoreSweepsIdleTargets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewMemoryStore(WithSweepInterval(time.Second))
		defer s.Close()
		lim := Limit{Limit: 1, Window: 500 * time.Millisecond}
		g := make([]Grant, 1)
		_, _ = s.Reserve(context.Background(), "a.example", lim, []Request{{ID: 1, N: 1}}, g)
		require.True(t, g[0].OK)
		time.Sleep(1500 * time.Millisecond)
		_, ok := s.targets.Load("a.example")
		require.False(t, ok, "an idle target is forgotten")
		_, _ = s.Reserve(context.Background(), "a.example", lim, []Request{{ID: 2, N: 1}}, g)
		require.True(t, g[0].OK)
	})
}

// TestConcurrentAllowNeverRefusesWithRoom: with room in the window, no
// concurrent caller is refused (a clock read outside the lock once made a
// caller older than the entry just written before it).
func TestConcurrentAllowNeverRefusesWithRoom(t *testing.T) {
	rules, err := ParseRules("*=100000/1ms")
	require.NoError(t, err)
	tr, err := New(rules, WithMargin(0))
	require.NoError(t, err)
	defer tr.Close()
	var refused atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 20000 {
				if d, _ := tr.Allow(context.Background(), "example.com"); !d.Allowed {
					refused.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.Zero(t, refused.Load())
}

func TestForgetKeepsTargetsInUse(t *testing.T) {
	tr := newTestThrottler(t)
	defer tr.Close()
	ctx := context.Background()
	for _, h := range []string{"a.example", "b.example", "c.example"} {
		require.NoError(t, tr.Wait(ctx, h))
	}
	busy, _, err := tr.Target(ctx, "b.example")
	require.NoError(t, err)
	v, _ := tr.targets.Load(busy)
	tg := v.(*target)
	tg.calls.mu.Lock()
	tg.calls.inflight = 1
	tg.calls.mu.Unlock()

	tr.forget()
	var left []string
	tr.targets.Range(func(k, _ any) bool { left = append(left, k.(string)); return true })
	require.Equal(t, []string{"b.example"}, left, "only the target with a call in flight stays")
	tg.calls.mu.Lock()
	tg.calls.inflight = 0
	tg.calls.mu.Unlock()

	d, err := tr.Allow(ctx, "a.example")
	require.NoError(t, err)
	require.True(t, d.Allowed, "a forgotten target is made anew; the store still has its log")
	require.Equal(t, 0, d.Remaining, "the memory store kept a.example's first admission")
}

func TestLocalFallbackWaitsWhenNoShareIsSafe(t *testing.T) {
	cases := []struct {
		name     string
		rule     string
		live     int
		newcomer bool          // the store last answered right after this process joined
		idle     time.Duration // since the store last answered
		units    int
		safe     bool // the control: a share is safe, the fallback admits
	}{
		{name: "a member of long standing with a fresh count", rule: "*=4/1s", live: 2, units: 1, safe: true},
		{name: "more processes than units", rule: "*=2/1s", live: 3, units: 1},
		{name: "the live count is stale", rule: "*=4/1s", live: 2, idle: time.Minute, units: 1},
		{name: "more units than the share", rule: "*=4/1s", live: 2, units: 3},
		// The others' counts may predate this process: each would take a
		// share as if it were not there.
		{name: "this process joined lately", rule: "*=4/1s", live: 2, newcomer: true, units: 1},
		// Alone when it joined: every process live now joined later, and
		// counted it.
		{name: "this process joined lately, alone", rule: "*=4/1s", live: 1, newcomer: true, units: 1, safe: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := &flakyStore{MemoryStore: NewMemoryStore(), live: c.live}
				defer store.Close()
				rules, err := ParseRules(c.rule)
				require.NoError(t, err)
				tr, err := New(rules, WithStore(store), WithLogger(quietLogger()))
				require.NoError(t, err)
				defer tr.Close()
				require.NoError(t, tr.Wait(context.Background(), "example.com"))
				if !c.newcomer {
					tg, err := tr.target(context.Background(), "example.com")
					require.NoError(t, err)
					time.Sleep(tr.shareSpan(tg))
					require.NoError(t, tr.Wait(context.Background(), "example.com"))
				}
				time.Sleep(c.idle)
				store.fail.Store(true)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				before := store.reserves.Load()
				err = tr.WaitN(ctx, "example.com", c.units)
				if c.safe {
					require.NoError(t, err, "the local fallback admits within the share")
					require.Equal(t, ModeFallback, tr.Mode())
					return
				}
				require.ErrorIs(t, err, ErrStoreUnavailable)
				require.Less(t, store.reserves.Load()-before, int64(40), "it waits for the store, it does not spin")
			})
		})
	}
}

// TestFallbackSharesTakeTurnsAtTheGap: processes in the fallback keep the
// rule's gap times their number each, and take turns at their places'
// gaps past whole windows on the clock, so that the fleet's requests stay
// a gap apart rather than leave together, even when the processes fell
// back at different moments.
func TestFallbackSharesTakeTurnsAtTheGap(t *testing.T) {
	for _, apart := range []time.Duration{0, 130 * time.Millisecond, 730 * time.Millisecond} {
		t.Run(fmt.Sprintf("fell back %v apart", apart), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const gap = 100 * time.Millisecond
				window := time.Second + DefaultMargin
				rules, err := ParseRules("*=4/1s,gap=100ms")
				require.NoError(t, err)
				var stores []*flakyStore
				var trs []*Throttler
				for place := 1; place <= 2; place++ {
					store := &flakyStore{MemoryStore: NewMemoryStore(), live: 2, place: place}
					defer store.Close()
					tr, err := New(rules, WithStore(store), WithLogger(quietLogger()))
					require.NoError(t, err)
					defer tr.Close()
					stores, trs = append(stores, store), append(trs, tr)
				}
				ctx := context.Background()
				for _, tr := range trs {
					require.NoError(t, tr.Wait(ctx, "example.com"))
				}
				tg, err := trs[0].target(ctx, "example.com")
				require.NoError(t, err)
				time.Sleep(trs[0].shareSpan(tg)) // members of long standing
				for _, tr := range trs {
					require.NoError(t, tr.Wait(ctx, "example.com"))
				}
				for _, s := range stores {
					s.fail.Store(true)
				}
				const n = 5
				sent := make([][]time.Time, len(trs))
				var wg sync.WaitGroup
				for i, tr := range trs {
					wg.Go(func() {
						time.Sleep(time.Duration(i) * apart) // the second falls back later
						for range n {
							require.NoError(t, tr.Wait(ctx, "example.com"))
							sent[i] = append(sent[i], time.Now())
						}
					})
				}
				wg.Wait()
				require.Equal(t, ModeFallback, trs[1].Mode())
				// A share of 2 per window (1.05s with the margin), spaced
				// 200ms: two requests a gap times two apart, then a window
				// after the first.
				require.Equal(t, 2*gap, sent[0][1].Sub(sent[0][0]), "each process keeps the gap times two")
				require.Equal(t, window, sent[0][2].Sub(sent[0][0]))
				all := slices.Concat(sent...)
				slices.SortFunc(all, time.Time.Compare)
				for k := 1; k < len(all); k++ {
					require.GreaterOrEqual(t, all[k].Sub(all[k-1]), gap, "the fleet's requests %d and %d", k-1, k)
				}
				for k := range n {
					d := sent[1][k].Sub(sent[0][k]) % window
					require.Equal(t, gap, (d+window)%window, "the second process's turn is a gap after the first's")
				}
			})
		})
	}
}

func TestFleetPauseHoldsInTheFallback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &flakyStore{MemoryStore: NewMemoryStore(), live: 2}
		defer store.Close()
		rules, err := ParseRules("*=4/1s")
		require.NoError(t, err)
		tr, err := New(rules, WithStore(store), WithLogger(quietLogger()))
		require.NoError(t, err)
		defer tr.Close()
		ctx := context.Background()
		// This process joins; two horizons later another process pauses
		// the target, and this one learns it from a reply.
		_, err = tr.Allow(ctx, "example.com")
		require.NoError(t, err)
		tg, err := tr.target(ctx, "example.com")
		require.NoError(t, err)
		time.Sleep(tr.shareSpan(tg))
		_, err = store.MemoryStore.Pause(ctx, "example.com", time.Minute)
		require.NoError(t, err)
		d, err := tr.Allow(ctx, "example.com")
		require.NoError(t, err)
		require.False(t, d.Allowed)
		store.fail.Store(true)
		start := time.Now()
		require.NoError(t, tr.Wait(ctx, "example.com"))
		require.GreaterOrEqual(t, time.Since(start), time.Minute, "the fleet's pause holds in the local fallback")
	})
}

// panicStore panics once, then behaves.
type panicStore struct {
	*MemoryStore
	panicked atomic.Bool
}

func (s *panicStore) Reserve(ctx context.Context, target string, lim Limit, reqs []Request, grants []Grant) (State, error) {
	if !s.panicked.Swap(true) {
		panic("broken store")
	}
	return s.MemoryStore.Reserve(ctx, target, lim, reqs, grants)
}

func TestAPanickingStoreDoesNotWedgeTheTarget(t *testing.T) {
	store := &panicStore{MemoryStore: NewMemoryStore()}
	defer store.Close()
	rules, err := ParseRules("*=10/1s")
	require.NoError(t, err)
	tr, err := New(rules, WithStore(store))
	require.NoError(t, err)
	defer tr.Close()
	func() {
		defer func() { require.Equal(t, "broken store", recover()) }()
		_ = tr.Wait(context.Background(), "example.com")
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	require.NoError(t, tr.Wait(ctx, "example.com"), "the next waiter is served")
}

// TestAMemoryStoreWithItsOwnClock: a MemoryStore passed with WithStore may
// run on a clock of its own (WithMemoryClock); its slots are put on the
// Throttler's clock by their delays, so waits are neither early (two in a
// window of one) nor late (an hour, for a store clock an hour ahead).
func TestAMemoryStoreWithItsOwnClock(t *testing.T) {
	rules, err := ParseRules("*=1/1s")
	require.NoError(t, err)
	for _, tc := range []struct {
		name  string
		clock func(t0 time.Time) func() time.Time
	}{
		{"from the epoch", func(t0 time.Time) func() time.Time {
			return func() time.Time { return time.UnixMicro(0).Add(time.Since(t0)) }
		}},
		{"an hour ahead", func(time.Time) func() time.Time {
			return func() time.Time { return time.Now().Add(time.Hour) }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ms := NewMemoryStore(WithMemoryClock(tc.clock(time.Now())))
				defer ms.Close()
				tr, err := New(rules, WithStore(ms))
				require.NoError(t, err)
				defer tr.Close()
				start := time.Now()
				var at []time.Duration
				for range 3 {
					require.NoError(t, tr.Wait(context.Background(), "example.com"))
					at = append(at, time.Since(start))
				}
				w := time.Second + DefaultMargin
				require.Equal(t, []time.Duration{0, w, 2 * w}, at, "admissions a window and the margin apart")
			})
		})
	}
}

// TestAWaitThroughAPauseEndsWithIt: a waiter that sleeps through a pause,
// checking the store's pause every PauseRecheck, wakes as it ends however
// long those checks take.
func TestAWaitThroughAPauseEndsWithIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rules, err := ParseRules("*=10/1s")
		require.NoError(t, err)
		store := slowPauseStore{NewMemoryStore()}
		defer store.Close()
		tr, err := New(rules, WithStore(store), WithStoreTimeout(time.Second))
		require.NoError(t, err)
		defer tr.Close()
		ctx := context.Background()
		_, err = tr.Pause(ctx, "example.com", time.Minute)
		require.NoError(t, err)
		start := time.Now()
		require.NoError(t, tr.Wait(ctx, "example.com"))
		require.Equal(t, time.Minute, time.Since(start), "woke as the pause ended, after 240 checks of 5ms")
	})
}

// TestAPauseKnownLocallyIsCappedWhenTheClockGoesBack: the pause a process
// knows of is kept on its wall clock; set back an hour, the clock would
// make a minute's pause look an hour and a minute long. What it writes
// back to a store that lost the pause is capped at the maximum pause.
func TestAPauseKnownLocallyIsCappedWhenTheClockGoesBack(t *testing.T) {
	rules, err := ParseRules("*=10/1s")
	require.NoError(t, err)
	store := &pauseRecorder{MemoryStore: NewMemoryStore()}
	defer store.Close()
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	tr, err := New(rules, WithStore(store), WithMaxPause(5*time.Minute), withClock(now))
	require.NoError(t, err)
	defer tr.Close()
	ctx := context.Background()
	_, err = tr.Pause(ctx, "example.com", time.Minute)
	require.NoError(t, err)
	clock.Add(int64(-time.Hour))
	old := store.MemoryStore
	store.MemoryStore = NewMemoryStore() // the store lost the pause
	old.Close()
	left, err := tr.Paused(ctx, "example.com")
	require.NoError(t, err)
	require.LessOrEqual(t, left, 5*time.Minute)
	var set []time.Duration // the pauses set (0 is a read)
	for _, d := range store.pauses() {
		if d > 0 {
			set = append(set, d)
		}
	}
	require.Len(t, set, 2, "the pause, then the one written back to the store that lost it")
	require.Equal(t, time.Minute, set[0])
	require.LessOrEqual(t, set[1], 5*time.Minute, "the pause written back is capped")
}

// pauseRecorder is a MemoryStore that records the pauses set on it.
type pauseRecorder struct {
	*MemoryStore
	mu  sync.Mutex
	set []time.Duration
}

func (s *pauseRecorder) Pause(ctx context.Context, target string, d time.Duration) (time.Duration, error) {
	s.mu.Lock()
	s.set = append(s.set, d)
	s.mu.Unlock()
	return s.MemoryStore.Pause(ctx, target, d)
}

func (s *pauseRecorder) pauses() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.set)
}

// slowPauseStore is a MemoryStore whose Pause takes 5ms, as a store a round
// trip away does.
type slowPauseStore struct{ *MemoryStore }

func (s slowPauseStore) Pause(ctx context.Context, target string, d time.Duration) (time.Duration, error) {
	time.Sleep(5 * time.Millisecond)
	return s.MemoryStore.Pause(ctx, target, d)
}

// TestSleepCtxEndsWithItsContext: an ended context ends a sleep at once,
// whatever its length, even none: a retry loop that sleeps a duration it
// computed must stop when its caller gives up.
func TestSleepCtxEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, sleepUntil(ctx, nil, 0))
	require.NoError(t, sleepUntil(ctx, nil, -time.Second))
	cancel()
	for _, d := range []time.Duration{-time.Second, 0, time.Hour} {
		require.ErrorIs(t, sleepUntil(ctx, nil, d), context.Canceled, "sleep %v", d)
	}
}

func TestCloseWakesSleepingWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// one.example allows 1 per second; the horizon is a second, so the
		// third waiter sleeps before it has even booked.
		tr := newTestThrottler(t, WithMaxAhead(time.Second))
		ctx := context.Background()
		require.NoError(t, tr.Wait(ctx, "one.example"))
		start := time.Now()
		errs := make(chan error, 3)
		for range 3 {
			go func() { errs <- tr.Wait(ctx, "one.example") }()
		}
		synctest.Wait() // all three asleep
		require.NoError(t, tr.Close())
		for range 3 {
			err := <-errs
			require.ErrorIs(t, err, ErrClosed)
			require.ErrorContains(t, err, `"one.example"`)
		}
		require.Zero(t, time.Since(start), "Close wakes the waiters at once")
	})
}

func TestAllowOnAnEndedContextRecordsNothing(t *testing.T) {
	tr := newTestThrottler(t)
	defer tr.Close()
	dead, cancel := context.WithCancel(context.Background())
	cancel()
	for range 3 {
		d, err := tr.Allow(dead, "example.com")
		require.ErrorIs(t, err, context.Canceled)
		require.False(t, d.Allowed)
	}
	for i := range 2 { // the default rule, 2/1s, is still whole
		d, err := tr.Allow(context.Background(), "example.com")
		require.NoError(t, err)
		require.True(t, d.Allowed, "decision %d", i)
	}
}

func TestAReservationGoesStaleAfterTheMargin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestThrottler(t) // margin 0: MinStale decides
		defer tr.Close()
		ctx := context.Background()
		now, err := tr.ReserveN(ctx, "one.example", 1) // due at once
		require.NoError(t, err)
		later, err := tr.ReserveN(ctx, "one.example", 1) // due in a second
		require.NoError(t, err)
		require.Equal(t, time.Second, later.Delay())

		time.Sleep(MinStale / 2)
		require.False(t, now.Stale(), "late by less than MinStale")
		time.Sleep(MinStale)
		require.True(t, now.Stale(), "late by more than MinStale")

		time.Sleep(time.Second - MinStale) // later's slot passed MinStale/2 ago
		require.False(t, later.Stale())
		time.Sleep(MinStale)
		require.True(t, later.Stale())
	})
}

// TestStaleSlotsAreLogged: a process whose slots go stale books again and
// again and sends little; the first stale slot is logged, with how late it
// was, then at most one line a minute, counting the stale slots since.
func TestStaleSlotsAreLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf strings.Builder
		tr := newTestThrottler(t, WithLogger(textLogger(&lockedWriter{w: &buf}, slog.MessageKey)))
		defer tr.Close()
		ctx := context.Background()
		stale := func() {
			t.Helper()
			r, err := tr.ReserveN(ctx, "many.example", 1)
			require.NoError(t, err)
			time.Sleep(r.Delay() + 100*time.Millisecond) // woke 100ms late
			require.True(t, r.Stale())
			require.NoError(t, r.Cancel(ctx))
		}
		r, err := tr.ReserveN(ctx, "many.example", 1)
		require.NoError(t, err)
		require.False(t, r.Stale(), "on time: not logged")
		require.NoError(t, r.Cancel(ctx))
		stale()
		stale()
		stale()
		time.Sleep(time.Minute)
		stale()
		require.Equal(t,
			"level=WARN target=many.example late=100ms stale=1\n"+
				"level=WARN target=many.example late=100ms stale=3\n", buf.String())
	})
}

// TestStaleLeavesHalfTheMarginForTheWay: a reservation goes stale half the
// margin past its slot, so that a request sent just before that still has
// the other half for its way to the target.
func TestStaleLeavesHalfTheMarginForTheWay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rules, err := ParseRules("*=10/1s")
		require.NoError(t, err)
		tr, err := New(rules, WithMargin(60*time.Millisecond))
		require.NoError(t, err)
		defer tr.Close()
		r, err := tr.ReserveN(context.Background(), "one.example", 1)
		require.NoError(t, err)
		time.Sleep(29 * time.Millisecond)
		require.False(t, r.Stale(), "29 ms late, against half of a 60 ms margin")
		time.Sleep(2 * time.Millisecond)
		require.True(t, r.Stale(), "31 ms late: the target may see it less than a window after the next")
	})
}

func TestAWaitThatWakesLongPastItsSlotBooksAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var frozen atomic.Int64 // how long the process was stopped, as its clock sees it
		clock := func() time.Time { return time.Now().Add(time.Duration(frozen.Load())) }
		tr := newTestThrottler(t, withClock(clock))
		defer tr.Close()
		ctx := context.Background()
		require.NoError(t, tr.Wait(ctx, "one.example")) // 1/1s: the window is full
		done := make(chan error)
		go func() { done <- tr.Wait(ctx, "one.example") }()
		synctest.Wait()                      // asleep until its slot, a second on
		frozen.Store(int64(2 * time.Second)) // the process is stopped for 2s
		require.NoError(t, <-done)           // it wakes 2s past its slot
		d, err := tr.Allow(ctx, "one.example")
		require.NoError(t, err)
		require.False(t, d.Allowed, "the wait was booked again when it woke: its entry is now, not 2s ago")
		require.Equal(t, time.Second, d.RetryAfter)
	})
}

func TestAQuotasRuleDoesNotDependOnTheFirstHost(t *testing.T) {
	ctx := context.Background()
	rules, err := ParseRules("*=2/1s", "api.example.com=10/1s", "*.com=3/1s")
	require.NoError(t, err)
	for _, order := range [][]string{{"api.example.com", "www.example.com"}, {"www.example.com", "api.example.com"}} {
		tr, err := New(rules, WithKeyMode(ByDomain))
		require.NoError(t, err)
		for _, host := range order {
			name, rule, err := tr.Target(ctx, host)
			require.NoError(t, err)
			require.Equal(t, "example.com", name)
			require.Equal(t, 10, rule.Limit, "%s, after %v: the domain's pattern sets the quota's rule", host, order)
		}
		name, rule, err := tr.Target(ctx, "other.com")
		require.NoError(t, err)
		require.Equal(t, "other.com", name)
		require.Equal(t, 3, rule.Limit, "a wildcard over domains applies to each")
		require.NoError(t, tr.Close())
	}

	for _, specs := range [][]string{
		{"api.example.com=10/1s", "www.example.com=2/1s"},
		{"example.com=10/1s", "*.api.example.com=2/1s"},
	} {
		rules, err := ParseRules(specs...)
		require.NoError(t, err)
		_, err = New(rules, WithKeyMode(ByDomain))
		require.ErrorIs(t, err, ErrBadRule, "%v", specs)
		require.ErrorContains(t, err, `quota "example.com"`)
		require.NoError(t, func() error { tr, err := New(rules); tr.Close(); return err }(), "by host they do not conflict")
	}
	same, err := ParseRules("api.example.com=10/1s", "www.example.com=10/1s")
	require.NoError(t, err)
	tr, err := New(same, WithKeyMode(ByDomain))
	require.NoError(t, err, "patterns that agree are fine")
	require.NoError(t, tr.Close())
}

// TestAStoresHoldIsLoggedOncePerHold: a hold is logged once however many
// decisions meet it, and a later hold (Redis restarted again) is logged
// again, whatever the time between them.
func TestAStoresHoldIsLoggedOncePerHold(t *testing.T) {
	logs := &logRecorder{}
	tr := newTestThrottler(t, WithLogger(slog.New(logs)))
	tg, err := tr.target(context.Background(), "a.example")
	require.NoError(t, err)
	start := time.Unix(1_700_000_000, 0)
	for _, at := range []time.Duration{0, 500 * time.Millisecond, 1900 * time.Millisecond} {
		tr.logYoung(tg, start.Add(at), 2*time.Second-at)
		tr.logLost(tg, start.Add(at), 2*time.Second-at)
	}
	require.Equal(t, 1, logs.count("the store's data is new"))
	require.Equal(t, 1, logs.count("Redis lost bookings"))
	tr.logYoung(tg, start.Add(5*time.Second), 2*time.Second)
	tr.logLost(tg, start.Add(5*time.Second), 2*time.Second)
	require.Equal(t, 2, logs.count("the store's data is new"), "the next hold")
	require.Equal(t, 2, logs.count("Redis lost bookings"), "the next hold")
}
