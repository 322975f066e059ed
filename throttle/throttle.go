package throttle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Throttler admits requests to targets so that, across every process sharing
// its Store, no target receives more than its rule allows in any interval of
// the rule's window (plus the margin).
//
// A Throttler is safe for concurrent use. Its methods take a host (a host
// name, host:port, or IP, as in a URL); the host is normalised and grouped
// into a target by the KeyMode, and the target's rule comes from Rules.
type Throttler struct {
	cfg       config
	rules     *Rules
	store     Store
	ownsStore bool
	baseLive  time.Duration // the store's liveness, before livenessFor
	local     *MemoryStore  // the fallback's log, on the local clock
	closed    atomic.Bool
	done      chan struct{} // closed by Close: wakes every sleeping waiter

	hosts      sync.Map // raw host -> *hostEntry
	hostCount  atomic.Int64
	targets    sync.Map     // target name -> *target
	down       atomic.Bool  // the store failed, and has not been found back since
	fellBack   atomic.Int64 // when down was last set (unix ns)
	failedAt   atomic.Int64 // when a store call last failed (unix ns)
	backAt     atomic.Int64 // when down was last cleared (unix ns)
	deadlines  deadlines    // of store calls
	youngLog   atomic.Int64 // when the young store's hold last logged ends (unix ns)
	lostLog    atomic.Int64 // when the lost log's hold last logged ends (unix ns)
	staleLog   atomic.Int64 // when stale slots may be logged again (unix ns)
	staleCount atomic.Int64 // stale slots since the last such line

	probeMu  sync.Mutex // guards the shared probe result
	probeAt  time.Time
	probeErr error
}

type hostEntry struct {
	tg      *target
	expires time.Time // ByIP only: when to resolve again
}

// Decision is the answer of Allow: whether the request may go now and what
// the target's log looks like. Durations of 0 mean "no wait".
type Decision struct {
	Allowed    bool          // the units were admitted and recorded
	Remaining  int           // units the window still has room for (a gap or queued bookings may still delay them); at most the room there is: on a RedisStore, for a log kept as a list, fewer by the entries that expired since the store last cut them, at most a quarter window ago
	RetryAfter time.Duration // when not allowed: until the earliest slot
	ResetAfter time.Duration // until the target's log is empty
}

// Mode says whether a Throttler is deciding with its store.
type Mode int

const (
	// ModeStore: the store decides. A target the store failed for before
	// it came back is decided by it again at its next call, once what the
	// failure policy admitted there is replayed to it.
	ModeStore Mode = iota
	// ModeFallback: the store failed, and has not been found back since:
	// the targets it failed for are decided by the failure policy.
	ModeFallback
)

// String returns "store" or "fallback".
func (m Mode) String() string {
	if m == ModeFallback {
		return "fallback"
	}
	return "store"
}

// New returns a Throttler for rules. With no options it keeps its logs in a
// new MemoryStore (one process), adds DefaultMargin to every window, keys by
// host and falls back locally (FailLocal) if a store fails. rules is copied.
// A nil or empty rules is an error: every target needs a limit.
func New(rules *Rules, opts ...Option) (*Throttler, error) {
	if rules == nil || rules.Len() == 0 {
		return nil, errorf("no rules: set at least a default rule (pattern %q)", DefaultPattern)
	}
	c := config{
		margin:        DefaultMargin,
		storeTimeout:  DefaultStoreTimeout,
		maxPause:      DefaultMaxPause,
		probeInterval: DefaultProbeInterval,
		grace:         DefaultRecoveryGrace,
		maxBatch:      64,
		now:           time.Now,
	}
	for _, o := range opts {
		o(&c)
	}
	switch {
	case c.margin < 0:
		return nil, errorf("margin %v must not be negative", c.margin)
	case c.margin > MaxWindow:
		// Larger, a window plus the margin could overflow a Duration.
		return nil, errorf("margin %v must be at most 366 days", c.margin)
	case c.storeTimeout <= 0:
		return nil, errorf("store timeout %v must be positive", c.storeTimeout)
	case c.maxPause <= 0 || c.maxPause > MaxWindow:
		return nil, errorf("max pause %v must be positive and at most 366 days", c.maxPause)
	case c.probeInterval <= 0:
		return nil, errorf("probe interval %v must be positive", c.probeInterval)
	case c.grace < 0:
		return nil, errorf("recovery grace %v must not be negative", c.grace)
	case c.maxAhead < 0 || c.maxAhead > MaxWindow:
		return nil, errorf("max ahead %v must not be negative nor more than 366 days", c.maxAhead)
	case c.maxBatch < 1:
		return nil, errorf("max batch %d must be at least 1", c.maxBatch)
	case c.policy < FailLocal || c.policy > FailClosed:
		return nil, errorf("unknown failure policy %d", c.policy)
	case c.keyMode < ByHost || c.keyMode > ByIP:
		return nil, errorf("unknown key mode %d", c.keyMode)
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	if c.resolver == nil {
		c.resolver = net.DefaultResolver
	}
	quotaRules, err := rules.forKeyMode(c.keyMode)
	if err != nil {
		return nil, fmt.Errorf("throttle: %w", err)
	}
	t := &Throttler{cfg: c, rules: quotaRules, store: c.store, done: make(chan struct{})}
	if t.store == nil {
		t.store, t.ownsStore = NewMemoryStore(WithMemoryClock(c.now)), true
	}
	t.local = NewMemoryStore(WithMemoryClock(c.now))
	t.baseLive = defaultLiveness
	if s, ok := t.store.(interface{ livenessBase() time.Duration }); ok {
		t.baseLive = s.livenessBase() // a RedisStore's WithLiveness
	}
	return t, nil
}

// Close releases the Throttler: the MemoryStore it created, if any, and its
// fallback log. Calls after Close return ErrClosed, and so do the waits
// still sleeping: they wake at once, release the slots they had booked
// (best effort) and return an error that wraps ErrClosed. A store passed
// with WithStore is left open.
func (t *Throttler) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	close(t.done)
	var err error
	if t.ownsStore {
		err = t.store.Close()
	}
	return errors.Join(err, t.local.Close())
}

// Mode reports whether the store decides (see ModeStore and
// ModeFallback).
func (t *Throttler) Mode() Mode {
	if t.down.Load() {
		return ModeFallback
	}
	return ModeStore
}

// Target returns the name of the quota that host counts against, and its
// rule.
func (t *Throttler) Target(ctx context.Context, host string) (string, Rule, error) {
	if t.closed.Load() {
		return "", Rule{}, ErrClosed
	}
	tg, err := t.target(ctx, host)
	if err != nil {
		return "", Rule{}, err
	}
	return tg.name, tg.rule, nil
}

// Wait blocks until the fleet may send one request to host. It is WaitN(ctx, host, 1).
func (t *Throttler) Wait(ctx context.Context, host string) error {
	return t.WaitN(ctx, host, 1)
}

// WaitN blocks until the fleet may send n units to host, then returns nil:
// the units are recorded in the log at that moment. Waiters are served first
// come, first served.
//
// It returns at once, with nothing reserved, when ctx has ended, when host is
// not a valid target (ErrBadTarget) or has no rule (ErrNoRule), when n is
// more than the limit (ErrTooMany) or less than 1, or when the earliest slot lies past ctx's
// deadline (an error matching both ErrWouldExceedDeadline and
// context.DeadlineExceeded). If ctx ends while it sleeps, the slot is
// released for later waiters and the error wraps ctx's error.
//
// A wait that wakes so long after its slot that sending then could break
// the limit (see Reservation.Stale: its process was stopped, say) gives the
// slot back and books again.
func (t *Throttler) WaitN(ctx context.Context, host string, n int) error {
	for {
		r, err := t.ReserveN(ctx, host, n)
		if err != nil {
			return err
		}
		if err := t.sleepThroughPause(ctx, r.tg, r.Delay()); err != nil {
			r.release()
			return t.sleepError(ctx, r.tg.name)
		}
		if !r.Stale() {
			return nil
		}
		r.release()
	}
}

// Reservation is a booked slot: the caller may send its units at Time().
// Cancel releases it for later waiters.
type Reservation struct {
	t    *Throttler
	tg   *target
	id   uint64
	n    int
	at   time.Time // local clock
	made time.Time // when ReserveN returned it, local clock
	via  via
	done atomic.Bool
}

type via int

const (
	viaStore via = iota
	viaLocal
	viaOpen
)

// Time returns when the reserved units may be sent, on the local clock.
func (r *Reservation) Time() time.Time { return r.at }

// Delay returns how long from now until Time, or 0 if it has passed.
func (r *Reservation) Delay() time.Duration { return max(0, r.at.Sub(r.t.cfg.now())) }

// MinStale is the least lateness after which a reservation is stale,
// whatever the margin: timers wake a little late even on an idle machine.
const MinStale = 10 * time.Millisecond

// MinMargin is the least margin that keeps a target's window within its
// limit when requests are sent as late as Stale allows: MinStale of
// lateness, and as much again for the request's way to the target after
// it is sent (writing it, the target's reading and scheduling it). It
// assumes a store whose round trip is well below that (a Redis nearby): a
// slot's local time is the middle of the call that booked it, and may be
// off by up to half of its round trip. A smaller margin is allowed (see
// WithMargin) but does not cover that.
const MinMargin = 2 * MinStale

// Stale reports whether the slot passed so long ago that sending now could
// break the fleet's limit: by more than half the margin (at least
// MinStale), counted from the slot or from when ReserveN returned,
// whichever is later (a slot that was due at once is not stale for the
// round trip that booked it). The other half of the margin is left for the
// request's way to the target once sent: a request sent the whole margin
// late that then took a few milliseconds to arrive would reach the target
// less than a window before one sent on time. A process that was stopped,
// starved or suspended wakes past its slot; it should Cancel and book
// again rather than send.
//
// A slot found stale is logged at Warn, at most once a minute per
// Throttler, with how late it was and how many went stale since the last
// line: a process whose slots keep going stale books again and again and
// sends little, and the line says why.
func (r *Reservation) Stale() bool {
	due := r.at
	if r.made.After(due) {
		due = r.made
	}
	now := r.t.cfg.now()
	late := now.Sub(due)
	if late <= max(r.t.cfg.margin/2, MinStale) {
		return false
	}
	r.t.logStale(r.tg, now, late)
	return true
}

// logStale counts a slot of tg found stale at now, late past it, and logs
// the count at most once a minute.
func (t *Throttler) logStale(tg *target, now time.Time, late time.Duration) {
	t.staleCount.Add(1)
	next := t.staleLog.Load()
	if now.UnixNano() < next || !t.staleLog.CompareAndSwap(next, now.Add(time.Minute).UnixNano()) {
		return
	}
	t.cfg.logger.Warn("fleetgate: slots went stale before their requests could leave and were booked again "+
		"(the process woke, or got its connection, more than half the margin late: starved, suspended or slow to connect); "+
		"a larger margin tolerates more", "target", tg.name, "late", late.Round(time.Millisecond), "stale", t.staleCount.Swap(0))
}

// Target returns the name of the quota the reservation counts against.
func (r *Reservation) Target() string { return r.tg.name }

// Cancel removes the reservation from the log, so that requests booked after
// it can have its slot (bookings already made keep theirs). Call it only for
// units that were not sent. Cancelling twice is a no-op.
func (r *Reservation) Cancel(ctx context.Context) error {
	if r.done.Swap(true) {
		return nil
	}
	return r.t.cancel(ctx, r)
}

func (r *Reservation) release() {
	if r.done.Swap(true) {
		return
	}
	// cancel bounds the store call by its timeout.
	_ = r.t.cancel(context.Background(), r) // best effort: an orphan entry only makes the log stricter
}

func (t *Throttler) cancel(ctx context.Context, r *Reservation) error {
	switch r.via {
	case viaStore:
		ctx, cancel := context.WithTimeout(ctx, t.storeTimeoutFor(r.n))
		defer cancel()
		if err := t.store.Cancel(ctx, r.tg.name, r.id, r.n); err != nil {
			return fmt.Errorf("throttle: cancel reservation for %q: %w", r.tg.name, err)
		}
	case viaLocal:
		return t.local.Cancel(ctx, r.tg.name, r.id, r.n)
	}
	return nil
}

// ReserveN books the earliest slot for n units to host and returns without
// sleeping until it, unless the slot lies beyond the booking horizon
// (WithMaxAhead): then it sleeps until the slot comes within reach and books
// it. See WaitN for the errors. The caller must either act at Time() or
// Cancel.
func (t *Throttler) ReserveN(ctx context.Context, host string, n int) (*Reservation, error) {
	if t.closed.Load() {
		return nil, ErrClosed
	}
	tg, err := t.target(ctx, host)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, waitError(ctx, tg.name)
	}
	if err := checkUnits(tg, n); err != nil {
		return nil, err
	}
	ahead := t.horizon(tg)
	storeDown := false
	for {
		// The store books no further ahead than the horizon: a waiter with
		// a later slot sleeps until it comes within reach. That bounds how
		// far ahead the fleet can have booked when the store fails.
		maxWait, hasDeadline := ahead, false
		if dl, ok := ctx.Deadline(); ok {
			left := dl.Sub(t.cfg.now())
			if left <= 0 {
				if storeDown {
					return nil, fmt.Errorf("throttle: wait for %q: %w: %w", tg.name, ErrStoreUnavailable, context.DeadlineExceeded)
				}
				return nil, deadlineError(tg.name, 0)
			}
			maxWait, hasDeadline = min(maxWait, left), true
		}
		w := &waiter{req: Request{ID: nextID(), N: n, MaxWait: maxWait}}
		if ms, ok := t.store.(*MemoryStore); ok {
			// In memory a decision takes a lock for a few hundred
			// nanoseconds: nothing to batch, and it cannot fail. Its slot
			// is put on this Throttler's clock by its delay: a store with a
			// clock of its own (WithMemoryClock) need not share it.
			var g [1]Grant
			ms.reserve(tg.name, tg.lim, []Request{w.req}, g[:])
			w.grant, w.at = g[0], t.cfg.now().Add(g[0].Delay)
		} else {
			if err := t.submit(ctx, tg, w); err != nil {
				return nil, err
			}
		}
		if errors.Is(w.err, errStoreDown) { // FailClosed: retry until ctx ends
			storeDown = true
			if err := t.sleep(ctx, min(t.cfg.probeInterval, maxWait)); err != nil {
				return nil, fmt.Errorf("throttle: wait for %q: %w: %w", tg.name, ErrStoreUnavailable, err)
			}
			continue
		}
		if w.err != nil {
			return nil, w.err
		}
		if paused := t.lostPause(tg, w); paused > 0 {
			if hasDeadline {
				if dl, _ := ctx.Deadline(); paused > dl.Sub(t.cfg.now()) {
					return nil, deadlineError(tg.name, paused)
				}
			}
			if err := t.sleepThroughPause(ctx, tg, paused); err != nil {
				return nil, t.sleepError(ctx, tg.name)
			}
			continue
		}
		if !w.grant.OK {
			if hasDeadline && w.grant.Delay > maxWait {
				if dl, _ := ctx.Deadline(); w.grant.Delay > dl.Sub(t.cfg.now()) {
					return nil, deadlineError(tg.name, w.grant.Delay)
				}
			}
			reach := ahead
			if w.ahead > 0 {
				reach = w.ahead
			}
			if err := t.sleepThroughPause(ctx, tg, max(w.grant.Delay-reach, time.Millisecond)); err != nil {
				return nil, t.sleepError(ctx, tg.name)
			}
			continue
		}
		r := &Reservation{t: t, tg: tg, id: w.req.ID, n: n, at: w.at, made: t.cfg.now(), via: w.via}
		if err := ctx.Err(); err != nil { // ended while the batch was in flight
			r.release()
			return nil, waitError(ctx, tg.name)
		}
		return r, nil
	}
}

// Allow reports whether one request to host may go now, and records it if
// so. It never waits. It is AllowN(ctx, host, 1).
func (t *Throttler) Allow(ctx context.Context, host string) (Decision, error) {
	return t.AllowN(ctx, host, 1)
}

// AllowN admits n units to host now if the fleet's limit allows it right now,
// and records them; otherwise it records nothing and Decision.RetryAfter says
// when the earliest slot is (later waiters may take it first). Errors are
// those of WaitN that do not involve waiting: in particular, when ctx has
// already ended it records nothing and returns an error wrapping ctx's.
func (t *Throttler) AllowN(ctx context.Context, host string, n int) (Decision, error) {
	if t.closed.Load() {
		return Decision{}, ErrClosed
	}
	tg, err := t.target(ctx, host)
	if err != nil {
		return Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, waitError(ctx, tg.name)
	}
	if err := checkUnits(tg, n); err != nil {
		return Decision{}, err
	}
	if ms, ok := t.store.(*MemoryStore); ok {
		return t.allowMemory(ctx, ms, tg, n), nil
	}
	// Concurrent decisions on one target share store calls, as waits do.
	w := &waiter{req: Request{ID: nextID(), N: n}}
	if err := t.submit(ctx, tg, w); err != nil {
		return Decision{}, err
	}
	switch {
	case errors.Is(w.err, errStoreDown):
		return Decision{RetryAfter: t.cfg.probeInterval}, fmt.Errorf("throttle: allow %q: %w", tg.name, ErrStoreUnavailable)
	case w.err != nil:
		return Decision{}, w.err
	case w.via == viaOpen:
		return Decision{Allowed: true}, nil
	}
	if paused := t.lostPause(tg, w); paused > 0 {
		return Decision{RetryAfter: paused}, nil
	}
	return decision(w.state, w.grant), nil
}

// lostPause checks a store's decision against the fleet's pause as this
// process last heard of it. A slot inside that pause, granted or not,
// means the store has lost it (Redis restarted empty): lostPause gives a
// granted slot back, tells the store of the pause again, so that the rest
// of the fleet holds back too, and returns what is left of it; otherwise
// it returns 0.
func (t *Throttler) lostPause(tg *target, w *waiter) time.Duration {
	if w.via != viaStore || tg.pauseEnd.Load() == 0 {
		return 0
	}
	now := t.cfg.now()
	paused := t.knownPause(tg, now)
	// The store's slots after a pause it kept fall at its end, give or take
	// the error of the local clock's reading of the store's: the margin.
	if paused <= 0 || !w.at.Before(now.Add(paused-max(t.cfg.margin, MinStale))) {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.storeTimeoutFor(w.req.N))
	defer cancel()
	if w.grant.OK {
		_ = t.store.Cancel(ctx, tg.name, w.req.ID, w.req.N)
	}
	_, _ = t.store.Pause(ctx, tg.name, paused)
	return paused
}

// knownPause returns what is left at now of the pause of tg this process
// knows of, at most the maximum pause: it is kept on the wall clock, which
// may have been set back since.
func (t *Throttler) knownPause(tg *target, now time.Time) time.Duration {
	return min(tg.pauseLeft(now), t.cfg.maxPause)
}

// allowMemory decides on the memory store, which cannot fail: no timeout,
// no fallback, and nothing escapes to the heap.
func (t *Throttler) allowMemory(ctx context.Context, ms *MemoryStore, tg *target, n int) Decision {
	reqs := [1]Request{{ID: nextID(), N: n}}
	var grants [1]Grant
	st, _ := ms.Reserve(ctx, tg.name, tg.lim, reqs[:], grants[:])
	return decision(st, grants[0])
}

func decision(st State, g Grant) Decision {
	d := Decision{Allowed: g.OK, Remaining: st.Remaining, ResetAfter: st.ResetAfter}
	if !d.Allowed {
		d.RetryAfter = max(g.Delay, time.Microsecond)
	}
	return d
}

// Pause holds every request to host's target, fleet-wide, for d (capped at
// the maximum pause): nothing is booked before it ends, and later waiters
// get its end as their slot. Slots booked before the pause keep their time;
// a caller that sleeps towards one should check Paused before sending (the
// transport package does). A pause only ever grows. It returns what is left
// of the pause. The pause is also kept locally, so it holds in the fallback.
func (t *Throttler) Pause(ctx context.Context, host string, d time.Duration) (time.Duration, error) {
	if t.closed.Load() {
		return 0, ErrClosed
	}
	tg, err := t.target(ctx, host)
	if err != nil {
		return 0, err
	}
	return t.pauseOn(ctx, tg, min(max(d, 0), t.cfg.maxPause), nil)
}

// pauseOn is Pause for tg. A read (d 0) asks the store with check when it
// is not nil (a RedisStore's check of a booking), else with the store's
// own read.
func (t *Throttler) pauseOn(ctx context.Context, tg *target, d time.Duration, check func(context.Context) (fleet time.Duration, young, lost bool, err error)) (time.Duration, error) {
	now := t.cfg.now()
	left, _ := t.local.Pause(ctx, tg.name, d)
	left = min(left, t.cfg.maxPause) // kept on the wall clock, which may have been set back
	if d > 0 {
		t.heardPause(tg, now, now.Add(left), true)
	} else {
		tg.pauseUntil(now.Add(left))
	}
	sctx, cancel := context.WithTimeout(ctx, t.cfg.storeTimeout)
	defer cancel()
	var fleet time.Duration
	var young, lost bool
	var err error
	r, reads := t.store.(pauseReader)
	switch {
	case d == 0 && check != nil:
		fleet, young, lost, err = check(sctx)
	case d == 0 && reads:
		fleet, young, err = r.readPause(sctx, tg.name)
	default:
		fleet, err = t.store.Pause(sctx, tg.name, d)
	}
	if err != nil {
		return left, fmt.Errorf("throttle: pause %q: %w", tg.name, err) // the local copy answers
	}
	switch { // the caller gives its slot back for either
	case lost:
		t.logLost(tg, now, fleet)
	case young:
		t.logYoung(tg, now, fleet)
	}
	if known := t.knownPause(tg, t.cfg.now()); known > fleet+max(t.cfg.margin, MinStale) {
		// The store lost a pause this process knows of (Redis restarted
		// empty): tell it again, for the processes that never heard of it.
		if again, err := t.store.Pause(sctx, tg.name, known); err == nil {
			fleet = again
		}
	}
	if young || lost { // logged above
		tg.pauseUntil(now.Add(fleet))
	} else {
		t.heardPause(tg, now, now.Add(fleet), false) // one another process set, longer than this one's
	}
	return max(left, fleet), nil
}

// Paused returns what is left of the fleet-wide pause on r's target, as
// Throttler.Paused does, for a caller about to send on r. On a RedisStore,
// while r's slot is still ahead, it also checks, in the same call, that
// the store still holds r's booking: Redis that failed over to a replica
// that lacked it has lost it, and another process may have booked its
// slot since. The store then holds the target as for a lost log (README,
// "When the store fails"), and Paused returns that hold: the caller gives
// r back and books again, as for a pause. (Once the slot has come, a
// later decision may have cut its entry, and it is not checked.) It must
// not run while r is being cancelled: a booking cancelled meanwhile reads
// as lost.
func (r *Reservation) Paused(ctx context.Context) (time.Duration, error) {
	t := r.t
	if t.closed.Load() {
		return 0, ErrClosed
	}
	var check func(context.Context) (time.Duration, bool, bool, error)
	if c, ok := t.store.(bookingChecker); ok && r.via == viaStore && !r.done.Load() && t.cfg.now().Before(r.at) {
		check = func(sctx context.Context) (time.Duration, bool, bool, error) {
			return c.checkBooking(sctx, r.tg.name, r.id, r.n)
		}
	}
	return t.pauseOn(ctx, r.tg, 0, check)
}

// Paused returns what is left of host's fleet-wide pause, 0 when there is
// none. When the store fails it answers from the local copy; when the
// store has lost a pause this process knows of (Redis restarted empty), it
// writes it back, for the processes that never heard of it. On a
// RedisStore that lost its data, a target this process has booked on
// reads as paused until the hold a booking would get ends (README, "When
// the store fails"): a slot booked before the loss may lie inside a pause
// the store forgot, so a caller that checks Paused before sending on it
// (the transport does) holds it back.
func (t *Throttler) Paused(ctx context.Context, host string) (time.Duration, error) {
	return t.Pause(ctx, host, 0)
}

// target returns the quota for host, from the cache when it can.
func (t *Throttler) target(ctx context.Context, host string) (*target, error) {
	if v, ok := t.hosts.Load(host); ok {
		he := v.(*hostEntry)
		if he.expires.IsZero() || t.cfg.now().Before(he.expires) {
			return he.tg, nil
		}
	}
	name, err := normalizeHost(host)
	if err != nil {
		return nil, fmt.Errorf("throttle: %w", err)
	}
	key := name
	var expires time.Time
	switch t.cfg.keyMode {
	case ByDomain:
		key = registrableDomain(name)
	case ByIP:
		if key, err = resolveIP(ctx, t.cfg.resolver, name); err != nil {
			return nil, fmt.Errorf("throttle: key by IP: %w", err) // may be transient: not ErrBadTarget
		}
		expires = t.cfg.now().Add(time.Minute)
	}
	rule, _, ok := t.rules.Lookup(key) // the quota's rule (see Rules.forKeyMode)
	if !ok {
		return nil, fmt.Errorf("throttle: %q: %w", name, ErrNoRule)
	}
	v, ok := t.targets.Load(key)
	if !ok {
		v, _ = t.targets.LoadOrStore(key, newTarget(key, rule, t.cfg.margin, t.cfg.maxAhead, t.cfg.maxBatch))
	}
	tg := v.(*target)
	if t.hostCount.Add(1) > maxCachedHosts {
		t.forget()
	}
	t.hosts.Store(host, &hostEntry{tg: tg, expires: expires})
	return tg, nil
}

// forget bounds the memory of a crawl over very many hosts: it empties the
// host cache and drops every target with no call in flight and no fallback
// under way. Dropping is safe: a target made anew has no live count, so its
// fallback would wait for the store, and seeds its local log at the horizon
// whatever tail it knew.
//
// Under FailLocal, a target the store failed for is kept until the store
// has been back long enough that no process's fallback booking on it is
// left in a window (its next call would replay them): a probe interval and
// the grace, for every process to find the store back, and a window.
// Under FailOpen and FailClosed it has no booking to replay, and goes as
// any other: a long outage over ever new hosts must not hold them all.
func (t *Throttler) forget() {
	t.hosts.Clear()
	t.hostCount.Store(0)
	now := t.cfg.now()
	back := !t.down.Load()
	backAt := time.Unix(0, t.backAt.Load())
	t.targets.Range(func(k, v any) bool {
		tg := v.(*target)
		tg.mu.Lock()
		replays := tg.degraded && t.cfg.policy == FailLocal
		if tg.calls.idle() && (!replays || back && now.Sub(backAt) > t.cfg.probeInterval+t.cfg.grace+tg.lim.Window) {
			t.targets.Delete(k)
		}
		tg.mu.Unlock()
		return true
	})
}

// ids numbers requests across every Throttler of the process, so that
// Throttlers sharing one store never name two entries alike.
var ids atomic.Uint64

func nextID() uint64 { return ids.Add(1) }

// maxCachedHosts bounds the host cache of a long crawl over many hosts.
const maxCachedHosts = 100_000

// sleep sleeps d, or returns ctx's error (with its cause) as soon as ctx
// ends (at once if it has, whatever d), or ErrClosed as soon as Close is
// called.
func (t *Throttler) sleep(ctx context.Context, d time.Duration) error {
	return sleepUntil(ctx, t.done, d)
}

// PauseRecheck is how often a process whose waiters sleep through a pause
// it knows of makes sure the store still holds it (see Paused), so that a
// pause Redis lost in a restart is written back before the other
// processes' next requests, not after the pause.
const PauseRecheck = 250 * time.Millisecond

// sleepThroughPause is sleep for a waiter of tg: while a pause this
// process knows of lasts, one waiter of the target checks the store's
// pause every PauseRecheck.
//
// It ends d after it began, however long the checks take: the sleeps run
// on the wall clock, and so does the end.
func (t *Throttler) sleepThroughPause(ctx context.Context, tg *target, d time.Duration) error {
	end := time.Now().Add(d)
	for left := d; left > PauseRecheck && tg.pauseLeft(t.cfg.now()) > PauseRecheck; left = time.Until(end) {
		if err := t.sleep(ctx, PauseRecheck); err != nil {
			return err
		}
		now := t.cfg.now().UnixNano()
		if last := tg.pauseChecked.Load(); now-last >= int64(PauseRecheck) && tg.pauseChecked.CompareAndSwap(last, now) {
			_, _ = t.Pause(ctx, tg.name, 0) // writes the pause back if the store lost it
		}
	}
	return t.sleep(ctx, time.Until(end))
}

// sleepError is the error of a wait whose sleep ended early: Close's, or
// ctx's.
func (t *Throttler) sleepError(ctx context.Context, target string) error {
	if ctx.Err() == nil && t.closed.Load() {
		return fmt.Errorf("throttle: wait for %q: %w", target, ErrClosed)
	}
	return waitError(ctx, target)
}

// sleepUntil sleeps d, or returns ctx's error (with its cause, see
// ctxError) or ErrClosed as soon as ctx ends or closed is closed (a nil
// closed never is).
func sleepUntil(ctx context.Context, closed <-chan struct{}, d time.Duration) error {
	if ctx.Err() != nil {
		return ctxError(ctx)
	}
	select {
	case <-closed:
		return ErrClosed
	default:
	}
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctxError(ctx)
	case <-closed:
		return ErrClosed
	}
}

// checkUnits returns an error unless a request of n units could ever be
// admitted on tg: ErrTooMany past its limit, and a plain error below 1 (a
// caller's mistake, not a limit).
func checkUnits(tg *target, n int) error {
	switch {
	case n < 1:
		return fmt.Errorf("throttle: %q: %d units: want at least 1", tg.name, n)
	case n > tg.rule.Limit:
		return fmt.Errorf("throttle: %q: %w: %d units, limit %d", tg.name, ErrTooMany, n, tg.rule.Limit)
	}
	return nil
}
