package transport

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetgate/fleetgate/backoff"
)

// Canonical names of the fields that can say how many requests remain;
// without one of them no rate-limit hint can pause anything.
var remainingFields = [...]string{
	http.CanonicalHeaderKey("RateLimit"),
	http.CanonicalHeaderKey("RateLimit-Remaining"),
	http.CanonicalHeaderKey("X-RateLimit-Remaining"),
	http.CanonicalHeaderKey("X-Rate-Limit-Remaining"),
}

// signals is what one response said about the target.
type signals struct {
	retryAfter time.Duration // a valid Retry-After on a 429 or 503, capped
	pause      time.Duration // the fleet-wide pause asked for, capped; 0: none
}

// observe reads resp's signals, pauses the fleet when the target asks for
// it, and keeps the run of 429s up to date. sent is when the attempt was
// sent. It never fails: unusable fields are logged at Debug and ignored; a
// Retry-After cut to the cap, and a pause the store could not take, are
// logged at Warn (the Throttler logs the pause itself).
func (tr *Transport) observe(ctx context.Context, host string, resp *http.Response, sent time.Time) signals {
	var sg signals
	now := tr.cfg.now()
	// Dates and Unix times in the response are the server's: read them
	// against its clock, so that a local clock off by seconds does not
	// shorten the fleet's pause.
	serverNow := backoff.ResponseDate(resp.Header, now)
	status := resp.StatusCode
	hasRetryAfter := false
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		if v, ok := resp.Header["Retry-After"]; ok && len(v) > 0 {
			// Read against a cap a second longer, to tell a value cut to
			// the cap from one that asked for it exactly.
			d, err := backoff.ParseRetryAfterField(v, serverNow, tr.cfg.maxRetryAfter+time.Second)
			capped := d > tr.cfg.maxRetryAfter
			d = min(d, tr.cfg.maxRetryAfter)
			switch {
			case err != nil:
				tr.log(ctx, slog.LevelDebug, "fleetgate: ignoring Retry-After", host, "status", status, "error", err)
			default:
				hasRetryAfter = true
				sg.retryAfter, sg.pause = d, d
				if capped {
					// The target asked for longer than the fleet waits:
					// worth a line, as the next attempt may anger it.
					tr.log(ctx, slog.LevelWarn, "fleetgate: Retry-After capped", host,
						"status", status, "value", truncate(v[0]), "cap", tr.cfg.maxRetryAfter)
				}
			}
		}
	}
	if hasRemaining(resp.Header) {
		hint, _ := backoff.ParseRateLimit(resp.Header, serverNow, tr.cfg.maxRetryAfter)
		switch {
		case hint.Remaining < 0:
			tr.log(ctx, slog.LevelDebug, "fleetgate: ignoring unusable rate-limit fields", host, "status", status)
		case hint.Remaining == 0 && hint.Reset > 0:
			sg.pause = max(sg.pause, hint.Reset)
		case hint.Remaining == 0:
			tr.log(ctx, slog.LevelDebug, "fleetgate: no requests remaining but no usable reset; not pausing", host, "status", status)
		}
	}
	escalated := ""
	switch {
	case status == http.StatusTooManyRequests && !hasRetryAfter:
		if target, err := tr.target(ctx, host); err == nil {
			if d, ok := tr.streaks.escalate(target, sent, now, tr.cfg.pausePolicy, tr.cfg.maxRetryAfter); ok {
				sg.pause = max(sg.pause, min(d, tr.cfg.maxRetryAfter))
				escalated = target
			}
		}
	case status >= 200 && status < 300 && tr.streaks.active():
		if target, err := tr.target(ctx, host); err == nil {
			tr.streaks.reset(target, sent)
		}
	}
	if sg.pause > 0 {
		// The signal matters to the fleet even if this caller gives up now;
		// the Throttler bounds the store call by its own timeout, and logs
		// the pause, once however many responses ask for it.
		if _, err := tr.t.Pause(context.WithoutCancel(ctx), host, sg.pause); err != nil {
			tr.log(ctx, slog.LevelWarn, "fleetgate: pause kept locally only", host, "pause", sg.pause, "error", err)
		}
	}
	if escalated != "" {
		// Requests sent before the pause was in place were sent without
		// it: their 429s, of the same burst, say nothing new either.
		tr.streaks.heldFrom(escalated, tr.cfg.now())
	}
	return sg
}

func (tr *Transport) target(ctx context.Context, host string) (string, error) {
	name, _, err := tr.t.Target(ctx, host)
	return name, err
}

// log writes a line about a request to host at level, when the logger
// takes it: first the throttle's target for host (what its quota and
// pauses are keyed on, shared by every host and port that map to it), when
// it has one, then host as the URL gives it, then args.
func (tr *Transport) log(ctx context.Context, level slog.Level, msg, host string, args ...any) {
	if !tr.cfg.logger.Enabled(ctx, level) {
		return
	}
	head := []any{"host", host}
	if name, err := tr.target(ctx, host); err == nil {
		head = []any{"target", name, "host", host}
	}
	tr.cfg.logger.Log(ctx, level, msg, append(head, args...)...)
}

func hasRemaining(h http.Header) bool {
	for _, k := range remainingFields {
		if _, ok := h[k]; ok {
			return true
		}
	}
	return false
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// streaks counts, per target, the 429s without Retry-After in a row, so
// that each one pauses the fleet longer. A 429 or 2xx to a request sent
// before the latest escalation's pause was in place says nothing new (it
// was sent without that pause) and is ignored, so a burst of concurrent
// requests answered 429 together escalates once. A run lapses when no such 429
// comes for a while after its latest pause ended (escalate's lapse), so a
// target that comes back much later starts afresh, and a crawler that
// meets many targets once keeps only the recent runs. Safe for concurrent
// use.
type streaks struct {
	n       atomic.Int64 // len(m), read without the lock on every 2xx
	mu      sync.Mutex
	m       map[string]*streak
	sweepAt int // len(m) at which escalate drops the lapsed runs
}

type streak struct {
	count  int           // escalations so far
	prev   time.Duration // the last pause, for DecorrelatedJitter
	since  time.Time     // when the latest escalation's pause was in place
	held   bool          // its pause is in place (heldFrom); until then every answer is of its burst
	lapses time.Time     // when the run ends without another 429
}

// minSweep is the fewest runs streaks keeps before it looks for lapsed
// ones.
const minSweep = 64

// escalate records a 429 to target sent at sent and returns the pause it
// calls for, or false when the request was sent before the latest
// escalation's pause was in place. The run lapses lapse after that pause
// ends. The caller puts the pause in place, then calls heldFrom.
func (s *streaks) escalate(target string, sent, now time.Time, p *backoff.Exponential, lapse time.Duration) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.m[target]
	switch {
	case st != nil && now.After(st.lapses):
		*st = streak{} // a run that lapsed: this 429 begins a new one
	case st != nil && (!st.held || sent.Before(st.since)):
		return 0, false
	case st == nil:
		if s.m == nil {
			s.m = make(map[string]*streak)
		}
		s.sweep(now)
		st = &streak{}
		s.m[target] = st
		s.n.Store(int64(len(s.m)))
	}
	d := p.Delay(st.count, st.prev)
	st.count++
	st.prev, st.since, st.held, st.lapses = d, now, false, now.Add(d+lapse)
	return d, true
}

// sweep drops the runs lapsed at now once there are sweepAt of them, and
// sets the next sweep at twice as many as are left: a run costs O(1) to
// add, amortized.
func (s *streaks) sweep(now time.Time) {
	if len(s.m) < max(s.sweepAt, minSweep) {
		return
	}
	for target, st := range s.m {
		if now.After(st.lapses) {
			delete(s.m, target)
		}
	}
	s.sweepAt = 2 * len(s.m)
}

func (s *streaks) active() bool { return s.n.Load() > 0 }

// heldFrom records that the pause of target's latest escalation was in
// place at at, a store call after the 429 that asked for it: a 429 or 2xx
// to a request sent before then, answered before or after, says nothing
// new.
func (s *streaks) heldFrom(target string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.m[target]; st != nil && !st.held {
		if at.After(st.since) {
			st.since = at
		}
		st.held = true
	}
}

// reset ends target's run after a 2xx to a request sent at sent.
func (s *streaks) reset(target string, sent time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.m[target]; st != nil && st.held && !sent.Before(st.since) {
		delete(s.m, target)
		s.n.Store(int64(len(s.m)))
	}
}
