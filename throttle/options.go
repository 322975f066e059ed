package throttle

import (
	"log/slog"
	"net"
	"time"
)

// Defaults of New.
const (
	// DefaultMargin is added to every rule's window. It absorbs the spread
	// between the moment the fleet admits a request and the moment it
	// reaches the target (scheduling, a new connection's handshake, queueing
	// on the wire), so the target's own window never sees more than N. See
	// BENCHMARKS.md for the measured spread behind it.
	DefaultMargin = 50 * time.Millisecond

	// DefaultStoreTimeout bounds each store call (a call of many units gets
	// more, see WithStoreTimeout); past it the call counts as a store
	// failure and the failure policy applies. It is below the
	// margin: a slot's local time is the middle of the call's round trip,
	// wrong by at most half of it.
	DefaultStoreTimeout = 30 * time.Millisecond

	// DefaultMaxPause caps every fleet-wide pause, however long the target
	// (or a broken header) asks for.
	DefaultMaxPause = 5 * time.Minute

	// DefaultProbeInterval is how often a process in its fallback checks
	// whether the store is back.
	DefaultProbeInterval = 200 * time.Millisecond

	// DefaultRecoveryGrace is how long other processes may lag behind this
	// one in noticing that the store is back; see FailLocal.
	DefaultRecoveryGrace = time.Second
)

// FailurePolicy says what Wait does when the store errs or times out.
type FailurePolicy int

const (
	// FailLocal, the default: each process falls back to its fleet share of
	// the limit, N divided by the number of live processes it last saw for
	// the target (the largest recent count: a low count fresh after a Redis
	// restart never raises the share), kept in a local log.
	//
	// Entering the fallback, the local log starts full at the booking
	// horizon (WithMaxAhead), the furthest any process can have booked, so
	// the first local admission comes a whole window after every slot the
	// fleet booked before the failure. Local bookings reach at most one
	// probe interval ahead. Leaving it, the process replays its local
	// admissions into the store and adds placeholders for the other
	// processes' shares (named alike in every process, so they count once),
	// dated a probe interval plus RecoveryGrace ahead, so their last local
	// admissions count too; the target may be held for up to about two
	// windows after a recovery. A process waits for the store, as
	// FailClosed does, when no share is safe: it never heard how many
	// processes share the target, or its last count came more than half
	// the store's liveness before the failure (5 s by default, two windows
	// if longer: others may have joined since), or it joined the target's
	// live processes (first, or again after it dropped out of the count)
	// less than that before its last count and was not alone then (the
	// others may not have counted it), or the processes outnumber the
	// limit's units, or a request asks for more units than the share. The
	// store is probed on a fresh connection once every ProbeInterval for
	// all targets.
	//
	// What FailLocal cannot see: a process that made no call for a target
	// during the outage (one that starts right after Redis restarted empty,
	// say) does not know the others admitted locally, and around a recovery
	// may add its own share to theirs in one window. And a store that only
	// some processes cannot reach (a network partition) looks down to them
	// and up to the others, who admit the whole limit while the cut-off
	// ones admit their shares.
	FailLocal FailurePolicy = iota
	// FailOpen admits every request while the store fails. The target's
	// limit is no longer kept; use it only where availability matters more.
	FailOpen
	// FailClosed waits and retries the store until the context ends.
	FailClosed
)

// ParseFailurePolicy reads "local", "open" or "closed".
func ParseFailurePolicy(s string) (FailurePolicy, error) {
	switch s {
	case "local":
		return FailLocal, nil
	case "open":
		return FailOpen, nil
	case "closed":
		return FailClosed, nil
	}
	return 0, errorf("failure policy %q: want local, open or closed", s)
}

// String returns the name ParseFailurePolicy reads.
func (p FailurePolicy) String() string {
	switch p {
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	}
	return "local"
}

// An Option configures New.
type Option func(*config)

type config struct {
	store         Store
	margin        time.Duration
	keyMode       KeyMode
	policy        FailurePolicy
	storeTimeout  time.Duration
	maxPause      time.Duration
	probeInterval time.Duration
	grace         time.Duration
	maxBatch      int
	maxAhead      time.Duration
	logger        *slog.Logger
	resolver      *net.Resolver
	now           func() time.Time // the local clock; tests replace it
	testClock     bool             // now is a test's, not time.Now
}

// WithStore makes the Throttler use s (a RedisStore for a fleet). Without it,
// New creates a MemoryStore, which the Throttler closes on Close; a store
// passed here is closed by the caller.
func WithStore(s Store) Option { return func(c *config) { c.store = s } }

// WithMargin sets the guard interval added to every window (default
// DefaultMargin). Half of it is the lateness a reservation may be sent
// with (Reservation.Stale), half the request's way to the target; below
// MinMargin that does not hold. Zero is allowed, for callers that count
// admissions themselves, but requests admitted exactly a window apart
// reach a target closer together than that: three processes with no
// margin put 20 requests in a second at a target against 10/1s.
// Negative, or more than MaxWindow, is an error.
func WithMargin(d time.Duration) Option { return func(c *config) { c.margin = d } }

// WithKeyMode sets how requests are grouped into quotas (default ByHost).
func WithKeyMode(m KeyMode) Option { return func(c *config) { c.keyMode = m } }

// WithFailurePolicy sets what happens when the store fails (default FailLocal).
func WithFailurePolicy(p FailurePolicy) Option { return func(c *config) { c.policy = p } }

// WithStoreTimeout bounds each store call (default DefaultStoreTimeout).
// A decision's call may run up to a millisecond longer: calls that start
// within a millisecond of one another share one deadline. A call that
// books, cancels or restores more than 50 units gets 20 µs more for each
// unit past the first (a request of 10,000 units: 0.2 s more), since the
// store writes one log entry per unit; a decision's call counts at most
// the units the rule lets it book, up to the booking horizon.
func WithStoreTimeout(d time.Duration) Option { return func(c *config) { c.storeTimeout = d } }

// WithMaxPause caps fleet-wide pauses (default DefaultMaxPause); it must
// be positive and at most MaxWindow.
func WithMaxPause(d time.Duration) Option { return func(c *config) { c.maxPause = d } }

// WithProbeInterval sets how often a process in its fallback checks whether
// the store is back (default DefaultProbeInterval).
func WithProbeInterval(d time.Duration) Option { return func(c *config) { c.probeInterval = d } }

// WithRecoveryGrace sets how far ahead the placeholders for other processes'
// fallback shares are dated when this process leaves its fallback (default
// DefaultRecoveryGrace). It should cover how long the slowest process takes
// to notice that the store is back.
func WithRecoveryGrace(d time.Duration) Option { return func(c *config) { c.grace = d } }

// WithMaxBatch bounds how many waiters of one process on one target share a
// store call (default 64; 1 turns batching off).
func WithMaxBatch(n int) Option { return func(c *config) { c.maxBatch = n } }

// WithMaxAhead sets the horizon: the store never books a slot further ahead
// than d; a waiter whose slot lies beyond it sleeps until the slot comes
// within reach, then books it (one more store call). The horizon bounds how
// far ahead the fleet can have booked when the store fails, which is how
// long FailLocal must stay silent before it admits locally, and, with a
// window, how long a RedisStore whose data was lost holds a target found
// empty or missing its latest entries; processes sharing a store should
// share it. The default, 0,
// means one window (the rule's window plus the margin); more than
// MaxWindow is an error.
func WithMaxAhead(d time.Duration) Option { return func(c *config) { c.maxAhead = d } }

// WithLogger sets where the Throttler logs (default slog.Default()):
// transitions between the store and the fallback (at Warn and Info), the
// holds a RedisStore puts on targets after Redis lost data (Info, Warn),
// slots that went stale (Warn), and each fleet-wide pause, once per pause
// and process, whether this process set it or learned of it from the store
// (Info, "fleetgate: the target is paused for the whole fleet").
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithResolver sets the resolver used by ByIP (default net.DefaultResolver).
func WithResolver(r *net.Resolver) Option { return func(c *config) { c.resolver = r } }

// withClock replaces the local clock; tests only.
func withClock(now func() time.Time) Option {
	return func(c *config) { c.now, c.testClock = now, true }
}
