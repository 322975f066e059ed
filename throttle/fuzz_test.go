package throttle

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParseRule: any input either parses into a valid rule that round-trips,
// or fails with ErrBadRule; it never panics.
func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"100/1m", "5/1s,gap=200ms", "0/1s", "1/0s", "-5/1s", "1/1s,gap=", "9999999999999999999/1h", "1/1s,,", "1/1s,gap=1s,gap=2s", "1/2562047h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRule(s)
		if err != nil {
			if !errors.Is(err, ErrBadRule) {
				t.Fatalf("ParseRule(%q): error %v does not wrap ErrBadRule", s, err)
			}
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("ParseRule(%q) = %v, which is invalid: %v", s, r, err)
		}
		again, err := ParseRule(r.String())
		if err != nil || again != r {
			t.Fatalf("ParseRule(%q) = %v does not round-trip: %v, %v", s, r, again, err)
		}
	})
}

// FuzzNormalize: any host either normalises to a stable name made only of
// characters that are safe in a key, or fails with ErrBadTarget.
func FuzzNormalize(f *testing.F) {
	for _, s := range []string{"Example.COM:443", "[::1]:80", "bücher.example", "a{b}c", "", "..", "x:y:z", "[fe80::1%eth0]", "xn--", strings.Repeat("a.", 200)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Normalize(s)
		if err != nil {
			if !errors.Is(err, ErrBadTarget) {
				t.Fatalf("Normalize(%q): error %v does not wrap ErrBadTarget", s, err)
			}
			return
		}
		if strings.ContainsAny(n, "{}% \t\r\n/") || n == "" {
			t.Fatalf("Normalize(%q) = %q: unsafe in a key", s, n)
		}
		if again, err := Normalize(n); err != nil || again != n {
			t.Fatalf("Normalize(%q) = %q is not stable: %q, %v", s, n, again, err)
		}
	})
}
