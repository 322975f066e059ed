package throttle

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ErrBadRule is wrapped by every error about a rule that cannot be used.
var ErrBadRule = errors.New("bad rule")

// A Rule is a target's limit: at most Limit units in any interval of length
// Window, and, when Gap is positive, never two admissions closer than Gap.
//
// A Throttler adds its margin to the window, not to the gap: the gap spaces
// admissions, and at the target the spread between admission and arrival
// (what the margin absorbs) may bring two requests up to that much closer.
// Where the target's spacing is strict, add the margin to the gap.
//
// The zero Rule is invalid; use ParseRule or fill Limit and Window.
type Rule struct {
	Limit  int           // units per window; must be at least 1
	Window time.Duration // the window's length; must be positive
	Gap    time.Duration // minimum spacing between admissions; 0 means none
}

// ParseRule parses the rule syntax used everywhere in fleetgate:
//
//	N/DURATION[,gap=DURATION]
//
// for example "100/1m", "5/1s" or "100/1m,gap=200ms". N is written in
// decimal digits, without a sign or a leading zero; DURATION is a Go
// duration (time.ParseDuration) without a sign; a bare unit such as "100/m"
// is not accepted, because "1m" and "m" would then mean the same and "1ms"
// and "ms" would not. Space around N, DURATION and an option is ignored. A
// limit or window that is not positive, a negative gap or
// one longer than the window, a gap given twice, an empty option, or
// anything else that does not parse is an error wrapping ErrBadRule that
// quotes the rule.
func ParseRule(s string) (Rule, error) {
	fail := func(why string) (Rule, error) {
		return Rule{}, fmt.Errorf("%w %q: %s (want N/DURATION[,gap=DURATION], e.g. 100/1m)", ErrBadRule, s, why)
	}
	spec, opts, hasOpts := strings.Cut(s, ",")
	num, win, ok := strings.Cut(spec, "/")
	if !ok {
		return fail("missing '/'")
	}
	num, win = strings.TrimSpace(num), strings.TrimSpace(win)
	if strings.HasPrefix(num, "-") && num != "-" && strings.Trim(num[1:], "0123456789") == "" {
		return fail("limit must be at least 1")
	}
	if num == "" || strings.Trim(num, "0123456789") != "" {
		return fail("limit is not a whole number")
	}
	if len(num) > 1 && num[0] == '0' {
		return fail("limit has a leading zero")
	}
	limit, err := strconv.Atoi(num)
	if err != nil {
		return fail("limit is not a whole number")
	}
	window, err := time.ParseDuration(win)
	if err != nil || strings.HasPrefix(win, "+") {
		return fail("window is not a duration")
	}
	r := Rule{Limit: limit, Window: window}
	if hasOpts {
		gapSet := false
		for opt := range strings.SplitSeq(opts, ",") {
			k, v, ok := strings.Cut(opt, "=")
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			if !ok || k != "gap" {
				return fail(fmt.Sprintf("unknown option %q", opt))
			}
			if gapSet {
				return fail("gap given twice")
			}
			gapSet = true
			gap, err := time.ParseDuration(v)
			if err != nil || gap < 0 || strings.HasPrefix(v, "+") {
				return fail("gap is not a non-negative duration")
			}
			r.Gap = gap
		}
	}
	if err := r.Validate(); err != nil {
		return fail(strings.TrimPrefix(err.Error(), fmt.Sprintf("%v %s: ", ErrBadRule, r)))
	}
	return r, nil
}

// Bounds of a Rule. A log keeps one entry per admitted unit for a window
// (about 26 bytes each in Redis), so the limit is bounded; stores count in
// microseconds, so windows and gaps are at least one millisecond and one
// microsecond; and a window past a year is a mistake.
const (
	MaxLimit  = 100_000
	MinWindow = time.Millisecond
	MaxWindow = 366 * 24 * time.Hour
)

// Validate reports whether r can be used, with an error wrapping ErrBadRule.
func (r Rule) Validate() error {
	switch {
	case r.Limit < 1:
		return fmt.Errorf("%w %s: limit must be at least 1", ErrBadRule, r)
	case r.Limit > MaxLimit:
		return fmt.Errorf("%w %s: limit must be at most %d (the log keeps one entry per request in the window)", ErrBadRule, r, MaxLimit)
	case r.Window <= 0:
		return fmt.Errorf("%w %s: window must be positive", ErrBadRule, r)
	case r.Window < MinWindow:
		return fmt.Errorf("%w %s: window must be at least %v", ErrBadRule, r, MinWindow)
	case r.Window > MaxWindow:
		return fmt.Errorf("%w %s: window must be at most 366 days", ErrBadRule, r)
	case r.Gap < 0 || r.Gap > 0 && r.Gap < time.Microsecond:
		return fmt.Errorf("%w %s: gap must be 0 or at least 1µs", ErrBadRule, r)
	case r.Gap > r.Window:
		// The log forgets an admission a window after it, and the gap with
		// it: a longer gap would not be kept.
		return fmt.Errorf("%w %s: gap must be at most the window (for one request per %v, write 1/%v)", ErrBadRule, r, r.Gap, r.Gap)
	}
	return nil
}

// String returns r in the syntax ParseRule reads, its durations without
// zero minutes or seconds ("100/1m", not "100/1m0s").
func (r Rule) String() string {
	s := strconv.Itoa(r.Limit) + "/" + shortDuration(r.Window)
	if r.Gap != 0 { // a negative gap is shown, for the error that rejects it
		s += ",gap=" + shortDuration(r.Gap)
	}
	return s
}

// shortDuration is d.String() without trailing zero units: "1m", "1h30m".
func shortDuration(d time.Duration) string {
	s := d.String()
	if t, ok := strings.CutSuffix(s, "m0s"); ok {
		s = t + "m"
	}
	if t, ok := strings.CutSuffix(s, "h0m"); ok {
		s = t + "h"
	}
	return s
}
