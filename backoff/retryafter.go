package backoff

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultMaxRetryAfter is the cap [ParseRetryAfter] and [ParseRateLimit]
// apply to every wait when they are given a cap of zero or less.
const DefaultMaxRetryAfter = 5 * time.Minute

// ErrInvalidRetryAfter is wrapped by every error [ParseRetryAfter]
// returns; match it with errors.Is.
var ErrInvalidRetryAfter = errors.New("backoff: invalid Retry-After")

// httpDates are the three HTTP-date forms of RFC 9110 §5.6.7, as
// [http.ParseTime] knows them but with the RFC 850 form's zone pinned to
// GMT, so that no other zone abbreviation is read as UTC, and asctime's
// day of the month in both its forms (date3: 2DIGIT, or SP DIGIT).
var httpDates = [...]string{
	http.TimeFormat,                  // IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
	"Monday, 02-Jan-06 15:04:05 GMT", // RFC 850:     Sunday, 06-Nov-94 08:49:37 GMT
	time.ANSIC,                       // asctime:     Sun Nov  6 08:49:37 1994
	"Mon Jan 02 15:04:05 2006",       // asctime, its day as 2DIGIT: Sun Nov 06 08:49:37 1994
}

// ParseRetryAfter returns the wait an HTTP Retry-After field value asks
// for (RFC 9110 §10.2.3), measured from now.
//
// The value is delta-seconds (1*DIGIT) or an HTTP-date in one of the three
// forms [http.ParseTime] accepts, written exactly as RFC 9110 §5.6.7 has
// it: GMT (in the RFC 850 form too), the right weekday, two-digit fields
// and no fractional seconds. Surrounding spaces and tabs are ignored. A
// date in the past means 0. The result is capped at maxWait; maxWait <= 0
// means [DefaultMaxRetryAfter].
//
// Delta-seconds has no upper bound (RFC 9111 §1.2.2 reads a larger value
// as the largest it can hold): a number of seconds too large for a
// time.Duration, however many digits, asks for the longest wait, maxWait.
//
// An HTTP-date is read against now, which should be the server's clock
// when it is known (the response's Date field, see [ResponseDate]), not
// the local one: a local clock a few seconds off would shorten or
// lengthen every such wait by as much.
//
// Nothing is guessed: an empty value, a sign, a fraction or any other text
// yields 0 and an error wrapping [ErrInvalidRetryAfter] that quotes the
// value, truncated and with control bytes escaped.
func ParseRetryAfter(value string, now time.Time, maxWait time.Duration) (time.Duration, error) {
	if maxWait <= 0 {
		maxWait = DefaultMaxRetryAfter
	}
	v := strings.Trim(value, " \t")
	if v == "" {
		return 0, invalidRetryAfter(value, "empty")
	}
	if digits(v) {
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil || secs > math.MaxInt64/int64(time.Second) {
			return maxWait, nil // only digits: too many seconds to count
		}
		return min(time.Duration(secs)*time.Second, maxWait), nil
	}
	for _, layout := range httpDates {
		// time.Parse tolerates fractional seconds, one-digit hours, any
		// letter case and a wrong weekday; the round trip rejects them.
		if t, err := time.Parse(layout, v); err == nil && t.Format(layout) == v {
			return min(max(t.Sub(now), 0), maxWait), nil
		}
	}
	return 0, invalidRetryAfter(value, "neither delta-seconds nor an HTTP-date")
}

// ParseRetryAfterField reads a response's Retry-After field, given as its
// field lines (http.Header's values): one line is ParseRetryAfter's. A
// server that sends several lines asks for them all, so the longest wait
// is the answer, if every line is valid; one invalid line makes the whole
// field untrusted. (One line holding a list, "2, 3", is not split: an
// HTTP-date has a comma of its own; it is invalid.) No lines is an error
// wrapping [ErrInvalidRetryAfter] too.
func ParseRetryAfterField(lines []string, now time.Time, maxWait time.Duration) (time.Duration, error) {
	if len(lines) == 0 {
		return 0, invalidRetryAfter("", "no field")
	}
	var longest time.Duration
	for _, v := range lines {
		d, err := ParseRetryAfter(v, now, maxWait)
		if err != nil {
			return 0, err
		}
		longest = max(longest, d)
	}
	return longest, nil
}

// ResponseDate returns the time a response's Date field gives (RFC 9110
// §6.6.1), or now when it has none that parses: the clock to read the
// response's HTTP-dates and Unix times against. A Date field has whole
// seconds and tells when the response was made, so waits measured from it
// are at most a second and a transit time longer than from an exact clock:
// never shorter.
func ResponseDate(h http.Header, now time.Time) time.Time {
	if v := h.Get("Date"); v != "" {
		if t, err := http.ParseTime(v); err == nil {
			return t
		}
	}
	return now
}

// invalidRetryAfter returns an error wrapping ErrInvalidRetryAfter that
// quotes value and says why it was rejected.
func invalidRetryAfter(value, reason string) error {
	return fmt.Errorf("%w %s: %s", ErrInvalidRetryAfter, quote(value), reason)
}

// quote returns s Go-quoted and cut to 32 bytes, so that a header value
// cannot put control bytes or bulk into an error message.
func quote(s string) string {
	const n = 32
	if len(s) > n {
		return strconv.Quote(s[:n]) + "..."
	}
	return strconv.Quote(s)
}

// digits reports whether s is 1*DIGIT.
func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
