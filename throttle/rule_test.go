package throttle

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseRule(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Rule
		err  bool
	}{
		{name: "per minute", in: "100/1m", want: Rule{Limit: 100, Window: time.Minute}},
		{name: "per second", in: "5/1s", want: Rule{Limit: 5, Window: time.Second}},
		{name: "spaces", in: " 5 / 1s ", want: Rule{Limit: 5, Window: time.Second}},
		{name: "gap", in: "100/1m,gap=200ms", want: Rule{Limit: 100, Window: time.Minute, Gap: 200 * time.Millisecond}},
		{name: "spaces around an option", in: "10/1s , gap = 1ms ", want: Rule{Limit: 10, Window: time.Second, Gap: time.Millisecond}},
		{name: "compound window", in: "3/1m30s", want: Rule{Limit: 3, Window: 90 * time.Second}},
		{name: "zero limit", in: "0/1s", err: true},
		{name: "negative limit", in: "-1/1s", err: true},
		{name: "zero window", in: "5/0s", err: true},
		{name: "negative window", in: "5/-1s", err: true},
		{name: "bare unit", in: "5/s", err: true},
		{name: "no slash", in: "5", err: true},
		{name: "fraction", in: "1.5/1s", err: true},
		{name: "empty", in: "", err: true},
		{name: "unknown option", in: "5/1s,burst=3", err: true},
		{name: "negative gap", in: "5/1s,gap=-1s", err: true},
		{name: "bad gap", in: "5/1s,gap=soon", err: true},
		{name: "overflow", in: "99999999999999999999/1s", err: true},
		{name: "signed limit", in: "+10/1s", err: true},
		{name: "leading zero", in: "010/1s", err: true}, // octal to some readers
		{name: "signed window", in: "10/+1s", err: true},
		{name: "signed gap", in: "10/1s,gap=+100ms", err: true},
		{name: "signed gap after a space", in: "10/1s,gap= +100ms", err: true},
		{name: "trailing comma", in: "10/1s,", err: true},
		{name: "empty option", in: "10/1s,,gap=100ms", err: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRule(tt.in)
			if tt.err {
				require.Error(t, err)
				require.True(t, errors.Is(err, ErrBadRule), "error %v does not wrap ErrBadRule", err)
				require.Contains(t, err.Error(), tt.in, "the error must quote the rule")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
			again, err := ParseRule(got.String())
			require.NoError(t, err)
			require.Equal(t, got, again, "String must round-trip")
		})
	}
}

func TestRulesPrecedence(t *testing.T) {
	rs, err := ParseRules(
		"*=1/1s",
		"*.example.com=2/1s",
		"*.api.example.com=3/1s",
		"api.example.com=4/1s",
		"10.0.0.1=5/1s",
		"BÜCHER.example=6/1s",
	)
	require.NoError(t, err)
	tests := []struct {
		target  string
		limit   int
		pattern string
	}{
		{"api.example.com", 4, "api.example.com"},
		{"v1.api.example.com", 3, "*.api.example.com"},
		{"deep.v1.api.example.com", 3, "*.api.example.com"},
		{"www.example.com", 2, "*.example.com"},
		{"example.com", 1, "*"},
		{"notexample.com", 1, "*"},
		{"10.0.0.1", 5, "10.0.0.1"},
		{"xn--bcher-kva.example", 6, "xn--bcher-kva.example"},
	}
	for _, tt := range tests {
		t.Run(tt.target, func(t *testing.T) {
			r, p, ok := rs.Lookup(tt.target)
			require.True(t, ok)
			require.Equal(t, tt.limit, r.Limit)
			require.Equal(t, tt.pattern, p)
		})
	}

	t.Run("no default", func(t *testing.T) {
		rs, err := ParseRules("a.example=1/1s")
		require.NoError(t, err)
		_, _, ok := rs.Lookup("b.example")
		require.False(t, ok)
	})
}

func TestRulesErrorsNameTheSpec(t *testing.T) {
	for _, spec := range []string{"example.com", "example.com=0/1s", "example.com=5/0s", "*.=1/1s", "a*b.com=1/1s", "=1/1s", "*.exa mple.com=1/1s",
		"*.1.2.3.4=1/1s", "*.::1=1/1s", "*.[::1]=1/1s"} {
		t.Run(spec, func(t *testing.T) {
			_, err := ParseRules(spec)
			require.Error(t, err)
			require.ErrorIs(t, err, ErrBadRule)
		})
	}
	// A quota is a host's, whatever the port: a pattern with one would
	// seem to set a rule per port.
	for _, spec := range []string{"a.com:443=1/1s", "127.0.0.1:80=1/1s", "[::1]:80=1/1s", "*.a.com:443=1/1s", "a.com:=1/1s"} {
		_, err := ParseRules(spec)
		require.ErrorIs(t, err, ErrBadRule, spec)
		require.ErrorContains(t, err, "drop the port", spec)
		require.NotContains(t, err.Error(), "port :", spec)
	}
	for _, spec := range []string{"::1=1/1s", "[::1]=1/1s", "2001:db8::1=1/1s"} {
		_, err := ParseRules(spec)
		require.NoError(t, err, spec)
	}
	// A URL for a pattern: the error says what to write instead.
	for spec, want := range map[string]string{
		"http://a.com=1/1s":          `pattern "http://a.com" is a URL: write its host "a.com"`,
		"https://a.com:8443/x=1/1s":  `write its host "a.com"`,
		"http://=1/1s":               "is a URL: write a host, an IP or *.DOMAIN",
		"https://[::1]:80/path=1/1s": `write its host "::1"`,
	} {
		_, err := ParseRules(spec)
		require.ErrorIs(t, err, ErrBadRule, spec)
		require.ErrorContains(t, err, want, spec)
	}
	// A negative limit is below the least, not something else.
	_, err := ParseRule("-1/1s")
	require.ErrorContains(t, err, "limit must be at least 1")
	_, err = ParseRule("-/1s")
	require.ErrorContains(t, err, "limit is not a whole number")
}

// Rules.Parse, like Set, replaces the rule of a pattern that has one;
// ParseRules, given a whole set, calls that ambiguous.
func TestRulesParseReplaces(t *testing.T) {
	rs := &Rules{}
	require.NoError(t, rs.Parse("a.com=1/1s"))
	require.NoError(t, rs.Parse("A.COM.=4/1s"))
	r, _, ok := rs.Lookup("a.com")
	require.True(t, ok)
	require.Equal(t, "4/1s", r.String())
	_, err := ParseRules("a.com=1/1s", "A.COM.=4/1s")
	require.ErrorContains(t, err, "already has a rule")
}

func TestNormalize(t *testing.T) {
	tests := []struct{ in, want string }{
		{"Example.COM", "example.com"},
		{"example.com:8080", "example.com"},
		{"example.com.", "example.com"},
		{"[2001:DB8::1]:443", "2001:db8::1"},
		{"[2001:db8::1]", "2001:db8::1"},
		{"[2001:db8::1]:", "2001:db8::1"}, // an empty port, as "example.com:"
		{"2001:db8:0:0::1", "2001:db8::1"},
		{"127.0.0.1:80", "127.0.0.1"},
		{"[::ffff:127.0.0.1]:80", "127.0.0.1"}, // IPv4-mapped: the same host
		{"::FFFF:7f00:1", "127.0.0.1"},
		{"bücher.example", "xn--bcher-kva.example"},
		{"localhost", "localhost"},
		// inet_aton's forms of an IPv4 address, as resolvers read them.
		{"127.1", "127.0.0.1"},
		{"2130706433", "127.0.0.1"},
		{"0x7f.1:8080", "127.0.0.1"},
		{"0177.0.0.1", "127.0.0.1"},
		{"010.0.0.1", "8.0.0.1"},
		{"10.0x10.258", "10.16.1.2"},
		{"127.0.0.1.", "127.0.0.1"},
		// IDNA maps full-width digits and ideographic full stops to ASCII:
		// an address after the mapping is that address.
		{"１２７.１", "127.0.0.1"},
		{"１２７。０。０。１", "127.0.0.1"},
		{"ｅｘａｍｐｌｅ。ｃｏｍ。", "example.com"},
		{"host-1.example", "host-1.example"},
		{"0xcafe.example", "0xcafe.example"},
		{"My_Host.example.com", "my_host.example.com"}, // in DNS, and net/http fetches it
		{"_dmarc.example.com", "_dmarc.example.com"},
		{"bü_cher.example", "xn--b_cher-3ya.example"},
		// "--" as a label's third and fourth characters: in DNS (a video
		// CDN's hosts), and net/http fetches them.
		{"r4---sn-4g5ednsl.googlevideo.com", "r4---sn-4g5ednsl.googlevideo.com"},
		{"AB--cd.example.com", "ab--cd.example.com"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Normalize(tt.in)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
	for _, bad := range []string{"", "  ", "[::1", "exa mple.com", "a..b", "http://x.com/",
		"example.123", "1.2.3.4.5", "256.1.1.1", "1.2.3.256", "4294967296", "09.1", "1..2",
		"a!b.example", "a=b.example", "a@b.example", "a,b.example", "a$b.example", "-a.example", "a-.example", "ｅｘａｍｐｌｅ.１２３",
		"xn--ab.example", "xn--.example", // punycode that does not decode
		"[::1]x", "[::1]:99999", "[::1]:x", "[example.com]", "[example.com]:80", "[1.2.3.4]", "[]"} {
		t.Run("bad "+bad, func(t *testing.T) {
			_, err := Normalize(bad)
			require.ErrorIs(t, err, ErrBadTarget)
		})
	}
}

func TestRegistrableDomain(t *testing.T) {
	require.Equal(t, "example.co.uk", registrableDomain("www.api.example.co.uk"))
	require.Equal(t, "example.com", registrableDomain("example.com"))
	require.Equal(t, "10.1.2.3", registrableDomain("10.1.2.3"))
	require.Equal(t, "localhost", registrableDomain("localhost"))
}

func TestEscapeTag(t *testing.T) {
	require.Equal(t, "a%7Bb%7Dc%25", escapeTag("a{b}c%"))
	require.Equal(t, "example.com", escapeTag("example.com"))
}

func TestRuleBounds(t *testing.T) {
	for _, tt := range []struct{ in, why string }{
		{"100001/1s", "limit must be at most 100000"},
		{"1/999us", "window must be at least 1ms"},
		{"1/8785h", "window must be at most 366 days"},
		{"1/1s,gap=1ns", "gap must be 0 or at least 1µs"},
		{"1/1s,gap=8785h", "gap must be at most the window"},
		{"1/1s,gap=5s", "for one request per 5s, write 1/5s"},
		{"10/1s,gap=100ms,gap=400ms", "gap given twice"},
	} {
		t.Run(tt.in, func(t *testing.T) {
			_, err := ParseRule(tt.in)
			require.ErrorIs(t, err, ErrBadRule)
			require.ErrorContains(t, err, tt.why)
		})
	}
	r, err := ParseRule("100000/8784h")
	require.NoError(t, err)
	require.Equal(t, Rule{Limit: MaxLimit, Window: MaxWindow}, r)
}

// TestParseRulesRefusesAPatternTwice: two specs for one pattern, as written
// or once normalised, are ambiguous: an error naming both.
func TestParseRulesRefusesAPatternTwice(t *testing.T) {
	for _, specs := range [][2]string{
		{"example.com=1/1s", "example.com=2/1s"},
		{"example.com=1/1s", " EXAMPLE.com=1/1s"},
		{"*.example.com=1/1s", "*.Example.com=5/1m"},
		{"*=1/1s", "*=2/1s"},
	} {
		_, err := ParseRules("other.org=3/1s", specs[0], specs[1])
		require.ErrorIs(t, err, ErrBadRule, "%q", specs)
		require.ErrorContains(t, err, fmt.Sprintf("%q", specs[0]))
		require.ErrorContains(t, err, fmt.Sprintf("%q", specs[1]))
	}
	rs, err := ParseRules("example.com=1/1s", "*.example.com=2/1s", "*=3/1s")
	require.NoError(t, err, "a host, its wildcard and the default are three patterns")
	require.Equal(t, 3, rs.Len())
}

// A rule is shown as it would be written: no zero minutes or seconds.
func TestRuleString(t *testing.T) {
	for want, r := range map[string]Rule{
		"100/1m":            {Limit: 100, Window: time.Minute},
		"5/1h":              {Limit: 5, Window: time.Hour},
		"5/1h30m":           {Limit: 5, Window: 90 * time.Minute},
		"5/1h0m30s":         {Limit: 5, Window: time.Hour + 30*time.Second},
		"10/1s,gap=100ms":   {Limit: 10, Window: time.Second, Gap: 100 * time.Millisecond},
		"10/10m,gap=1m":     {Limit: 10, Window: 10 * time.Minute, Gap: time.Minute},
		"1/1m30s,gap=1m30s": {Limit: 1, Window: 90 * time.Second, Gap: 90 * time.Second},
		"3/500ms,gap=-1ms":  {Limit: 3, Window: 500 * time.Millisecond, Gap: -time.Millisecond},
	} {
		require.Equal(t, want, r.String())
	}
}
