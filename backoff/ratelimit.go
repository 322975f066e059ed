package backoff

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

const (
	// maxHorizon bounds the times a rate-limit field may state: a reset or
	// a window further away than this is distrusted and ignored.
	maxHorizon = 24 * time.Hour
	// epochThreshold tells reset values apart: above it (September 2001,
	// in seconds) a value is a Unix time, at or below a delta in seconds.
	epochThreshold = 1_000_000_000
)

// Hint is what a response's rate-limit fields say about the client's
// quota. A field the response did not state usably is 0, except
// Remaining, which is -1 when unknown.
type Hint struct {
	// Remaining is the number of requests left in the current window;
	// -1 when unknown.
	Remaining int
	// Reset is the time until the current window resets, capped at the
	// cap given to ParseRateLimit; 0 when unknown or already due.
	Reset time.Duration
	// Limit is the number of requests the server allows per window;
	// 0 when unknown.
	Limit int
	// Window is the length of the server's quota window, from the "w"
	// parameter of RateLimit-Policy; 0 when unknown.
	Window time.Duration
}

// ParseRateLimit reads the rate-limit fields of a response header:
//
//   - RateLimit and RateLimit-Policy as structured lists
//     (draft-ietf-httpapi-ratelimit-headers-08 and later), such as
//     `RateLimit: "default";r=50;t=30` with
//     `RateLimit-Policy: "default";q=100;w=60`. When RateLimit names
//     several policies, the one with the fewest requests remaining wins;
//     Limit and Window come from the RateLimit-Policy item of that name.
//   - RateLimit as a dictionary (draft 07), such as
//     `RateLimit: limit=100, remaining=50, reset=30`, and the separate
//     RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset fields
//     (drafts 00 to 06). Limit and Window then also come from the first
//     item of RateLimit-Policy, such as `100;w=60`.
//   - X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset, and
//     the same names spelt X-Rate-Limit-*.
//
// Each field of the Hint is taken from the first of these sources, in
// that order, that states it usably. Every value must be 1*DIGIT: a
// count, or a time in seconds. A reset value above 1e9 is a Unix time in
// seconds, converted to a wait from now (pass the server's clock,
// [ResponseDate], where the response has one); at or below, it is
// delta-seconds. A reset in the
// past means 0. Resets are capped at maxWait (maxWait <= 0 means
// [DefaultMaxRetryAfter]).
//
// Values that are malformed, signed, fractional, overflowing, or put a
// reset or window more than 24 hours from now, are distrusted and
// ignored; ParseRateLimit never fails and never panics. ok is false, and
// hint is Hint{Remaining: -1}, when no field was usable.
func ParseRateLimit(h http.Header, now time.Time, maxWait time.Duration) (hint Hint, ok bool) {
	if maxWait <= 0 {
		maxWait = DefaultMaxRetryAfter
	}
	cur, dict := current(parseList(strings.Join(h.Values("RateLimit"), ",")))
	pol := policy(parseList(strings.Join(h.Values("RateLimit-Policy"), ",")), cur)
	fields := func(name string) []string {
		return []string{
			h.Get("RateLimit-" + name),
			h.Get("X-RateLimit-" + name),
			h.Get("X-Rate-Limit-" + name),
		}
	}

	remaining, okRemaining := first(append([]string{cur.params["r"], dict["remaining"]}, fields("Remaining")...), count)
	reset, okReset := first(append([]string{cur.params["t"], dict["reset"]}, fields("Reset")...),
		func(s string) (time.Duration, bool) { return resetAfter(s, now) })
	limit, okLimit := first(append([]string{pol.params["q"], dict["limit"], pol.value}, fields("Limit")...), positive)
	window, okWindow := first([]string{pol.params["w"]}, windowLength)

	hint = Hint{Remaining: -1, Reset: min(reset, maxWait), Limit: limit, Window: window}
	if okRemaining {
		hint.Remaining = remaining
	}
	return hint, okRemaining || okReset || okLimit || okWindow
}

// first returns the first candidate that parse accepts.
func first[T any](candidates []string, parse func(string) (T, bool)) (T, bool) {
	for _, s := range candidates {
		if v, ok := parse(s); ok {
			return v, true
		}
	}
	var zero T
	return zero, false
}

// count parses 1*DIGIT that fits an int.
func count(s string) (int, bool) {
	if !digits(s) {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// positive parses 1*DIGIT that fits an int and is not 0.
func positive(s string) (int, bool) {
	n, ok := count(s)
	return n, ok && n > 0
}

// windowLength parses a window in seconds, from 1s to maxHorizon.
func windowLength(s string) (time.Duration, bool) {
	n, ok := count(s)
	if !ok || n <= 0 || n > int(maxHorizon/time.Second) {
		return 0, false
	}
	return time.Duration(n) * time.Second, true
}

// resetAfter converts a reset value, delta-seconds or a Unix time above
// epochThreshold, to a wait from now: 0 if it is past, and not ok if it
// is more than maxHorizon away.
func resetAfter(s string, now time.Time) (time.Duration, bool) {
	n, ok := count(s)
	if !ok {
		return 0, false
	}
	var d time.Duration
	if n > epochThreshold {
		d = time.Unix(int64(n), 0).Sub(now) // saturates instead of overflowing
	} else {
		d = time.Duration(n) * time.Second
	}
	return max(d, 0), d >= -maxHorizon && d <= maxHorizon
}

// member is one member of a structured-field List or Dictionary (RFC
// 9651), parsed leniently: key is the dictionary key ("" for a list
// item), value the bare item without string quotes, params its
// parameters.
type member struct {
	key, value string
	params     map[string]string
}

// parseList splits a List or Dictionary field value into its members,
// skipping empty ones. Commas and semicolons inside strings do not split.
func parseList(s string) []member {
	var ms []member
	for _, raw := range split(s, ',') {
		if strings.Trim(raw, " \t") == "" {
			continue
		}
		parts := split(raw, ';')
		m := member{params: make(map[string]string, len(parts)-1)}
		m.key, m.value = keyValue(parts[0])
		for _, p := range parts[1:] {
			if k, v := keyValue(p); k != "" {
				m.params[k] = v
			}
		}
		ms = append(ms, m)
	}
	return ms
}

// current picks the RateLimit list item with the fewest requests
// remaining (the first item if none states it usably) and collects the
// dictionary members by key.
func current(ms []member) (cur member, dict map[string]string) {
	dict = make(map[string]string)
	best, found := -1, false
	for _, m := range ms {
		if m.key != "" {
			dict[m.key] = m.value
			continue
		}
		r, ok := count(m.params["r"])
		if !found || ok && (best < 0 || r < best) {
			cur, found = m, true
			if ok {
				best = r
			}
		}
	}
	return cur, dict
}

// policy returns the RateLimit-Policy item that cur names, or the first
// item when cur is no structured item.
func policy(ps []member, cur member) member {
	for _, p := range ps {
		if p.key == "" && (cur.value == "" || p.value == cur.value) {
			return p
		}
	}
	return member{}
}

// keyValue splits "key=value" around its first "=", trimming spaces and
// tabs and removing string quotes from the value. Anything else is a
// bare item: key is "".
func keyValue(s string) (key, value string) {
	s = strings.Trim(s, " \t")
	if k, v, ok := strings.Cut(s, "="); ok && !strings.Contains(k, `"`) {
		return strings.Trim(k, " \t"), unquote(strings.Trim(v, " \t"))
	}
	return "", unquote(s)
}

// unquote removes the double quotes around a structured-field string.
func unquote(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return s[1 : len(s)-1]
	}
	return s
}

// split cuts s at every sep outside a double-quoted string.
func split(s string, sep byte) []string {
	var parts []string
	quoted, start := false, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && quoted:
			i++ // skip the escaped byte
		case c == '"':
			quoted = !quoted
		case c == sep && !quoted:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:])
}
