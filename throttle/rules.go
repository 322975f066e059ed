package throttle

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"sort"
	"strings"
)

// Rules maps targets to their Rule: exact names (a host or an IP), wildcards
// of the form "*.example.com", and a default. Lookup precedence is fixed:
// the exact name, then the longest matching wildcard, then the default.
//
// A wildcard "*.example.com" matches every name ending in ".example.com", at
// any depth, but not "example.com" itself. Patterns are normalised the way
// targets are (lower case, IDN to ASCII, no trailing dot).
//
// The zero Rules is empty and valid. Rules is not safe for concurrent
// mutation; New copies it, so changing it afterwards has no effect on a
// Throttler.
type Rules struct {
	exact  map[string]Rule
	wild   []wildRule // longest suffix first
	def    Rule
	hasDef bool
}

type wildRule struct {
	suffix string // ".example.com"
	rule   Rule
}

// DefaultPattern is the pattern that sets the default rule in Set and Parse.
const DefaultPattern = "*"

// ParseRules builds Rules from specs of the form PATTERN=RULE, for example
// "api.example.com=10/1s", "*.example.com=100/1m,gap=200ms" or "*=1/1s" for
// the default. The first bad spec stops it with an error naming the spec; a
// pattern given twice (as written or once normalised: "Example.COM" is
// "example.com") is ambiguous, an error naming both specs.
func ParseRules(specs ...string) (*Rules, error) {
	rs := &Rules{}
	seen := make(map[string]string, len(specs))
	for _, spec := range specs {
		if err := rs.Parse(spec); err != nil {
			return nil, err
		}
		pattern, _, _ := strings.Cut(spec, "=")
		key, _ := canonicalPattern(pattern) // Parse has checked it
		if prev, ok := seen[key]; ok {
			return nil, fmt.Errorf("%w %q: pattern %q already has a rule (%q)", ErrBadRule, spec, key, prev)
		}
		seen[key] = spec
	}
	return rs, nil
}

// Parse adds one PATTERN=RULE spec (see ParseRules for the syntax). Like
// Set, and unlike ParseRules, which takes a whole set at once and calls
// it ambiguous, it replaces the rule of a pattern that already has one.
func (rs *Rules) Parse(spec string) error {
	pattern, rule, ok := strings.Cut(spec, "=")
	if !ok {
		return fmt.Errorf("%w %q: want PATTERN=N/DURATION, e.g. example.com=10/1s", ErrBadRule, spec)
	}
	r, err := ParseRule(rule)
	if err != nil {
		return fmt.Errorf("rule for %q: %w", strings.TrimSpace(pattern), err)
	}
	return rs.Set(pattern, r)
}

// Set adds or replaces the rule for pattern: a host name, an IP address,
// "*.domain" or DefaultPattern. Setting the same pattern twice replaces the
// earlier rule. An invalid pattern or rule is an error that names it.
func (rs *Rules) Set(pattern string, r Rule) error {
	if err := r.Validate(); err != nil {
		return fmt.Errorf("rule for %q: %w", pattern, err)
	}
	p, err := canonicalPattern(pattern)
	if err != nil {
		return err
	}
	if p == DefaultPattern {
		rs.def, rs.hasDef = r, true
		return nil
	}
	if name, ok := strings.CutPrefix(p, "*."); ok {
		suffix := "." + name
		for i := range rs.wild {
			if rs.wild[i].suffix == suffix {
				rs.wild[i].rule = r
				return nil
			}
		}
		rs.wild = append(rs.wild, wildRule{suffix: suffix, rule: r})
		sort.SliceStable(rs.wild, func(i, j int) bool { return len(rs.wild[i].suffix) > len(rs.wild[j].suffix) })
		return nil
	}
	if rs.exact == nil {
		rs.exact = make(map[string]Rule)
	}
	rs.exact[p] = r
	return nil
}

// canonicalPattern returns pattern as Rules keeps it: DefaultPattern,
// "*." and a normalised domain, or a normalised host or IP. An invalid
// pattern is an error that names it.
func canonicalPattern(pattern string) (string, error) {
	p := strings.TrimSpace(pattern)
	if p == DefaultPattern {
		return p, nil
	}
	if strings.Contains(p, "://") {
		want := "a host, an IP or *.DOMAIN"
		if u, err := url.Parse(p); err == nil && u.Hostname() != "" {
			want = fmt.Sprintf("its host %q", u.Hostname())
		}
		return "", fmt.Errorf("%w: pattern %q is a URL: write %s", ErrBadRule, pattern, want)
	}
	if _, port, err := net.SplitHostPort(p); err == nil {
		what := "names port " + port
		if port == "" {
			what = "ends in ':' with no port"
		}
		return "", fmt.Errorf("%w: pattern %q %s: a quota is a host's, whatever the port; drop the port", ErrBadRule, pattern, what)
	}
	if rest, ok := strings.CutPrefix(p, "*."); ok {
		name, err := normalizeHost(rest)
		if err != nil || strings.ContainsAny(name, "*") {
			return "", fmt.Errorf("%w: pattern %q is not *.DOMAIN", ErrBadRule, pattern)
		}
		if _, err := netip.ParseAddr(name); err == nil {
			return "", fmt.Errorf("%w: pattern %q: an IP address has no subdomains; write the address alone", ErrBadRule, pattern)
		}
		return "*." + name, nil
	}
	name, err := normalizeHost(p)
	if err != nil || strings.Contains(name, "*") {
		return "", fmt.Errorf("%w: pattern %q is not a host, an IP, *.DOMAIN or %q", ErrBadRule, pattern, DefaultPattern)
	}
	return name, nil
}

// Lookup returns the rule for a normalised target and the pattern that
// matched it ("*" for the default); ok is false when nothing matches.
func (rs *Rules) Lookup(target string) (r Rule, pattern string, ok bool) {
	if r, ok := rs.exact[target]; ok {
		return r, target, true
	}
	for _, w := range rs.wild {
		if strings.HasSuffix(target, w.suffix) {
			return w.rule, "*" + w.suffix, true
		}
	}
	if rs.hasDef {
		return rs.def, DefaultPattern, true
	}
	return Rule{}, "", false
}

// Len returns the number of patterns, the default included.
func (rs *Rules) Len() int {
	n := len(rs.exact) + len(rs.wild)
	if rs.hasDef {
		n++
	}
	return n
}

func (rs *Rules) clone() *Rules {
	c := &Rules{def: rs.def, hasDef: rs.hasDef, wild: append([]wildRule(nil), rs.wild...)}
	if len(rs.exact) > 0 {
		c.exact = make(map[string]Rule, len(rs.exact))
		for k, v := range rs.exact {
			c.exact[k] = v
		}
	}
	return c
}

// forKeyMode returns the rules of the quotas under mode, each looked up by
// the quota's name, so that every process gives a quota the same rule
// whichever of its hosts it meets first.
//
// ByHost: rs itself. ByDomain: a pattern within one registrable domain (an
// exact host, or a wildcard such as *.api.example.com) sets the rule of
// that domain's quota, and two that set different rules for one domain are
// an error naming both; a wildcard over many domains (*.co.uk, *.com) stays
// a wildcard over their names. ByIP: a quota is an address, so only exact
// IP patterns and the default can apply; a host name or wildcard pattern is
// an error naming it.
func (rs *Rules) forKeyMode(mode KeyMode) (*Rules, error) {
	if mode == ByHost {
		return rs.clone(), nil
	}
	out := &Rules{def: rs.def, hasDef: rs.hasDef}
	setBy := map[string]string{} // quota name -> the pattern that set its rule
	set := func(quota, pattern string, r Rule) error {
		if prev, ok := setBy[quota]; ok {
			if out.exact[quota] != r {
				return fmt.Errorf("%w: with key mode %v, %q (%v) and %q (%v) both set the rule of the quota %q; give it one rule",
					ErrBadRule, mode, prev, out.exact[quota], pattern, r, quota)
			}
			return nil
		}
		if out.exact == nil {
			out.exact = make(map[string]Rule)
		}
		setBy[quota], out.exact[quota] = pattern, r
		return nil
	}
	byIP := func(pattern string) error {
		return fmt.Errorf("%w: pattern %q cannot apply with key mode ip: a quota is an address; give the address its rule (1.2.3.4=N/DURATION) or use the default",
			ErrBadRule, pattern)
	}
	for _, p := range slices.Sorted(maps.Keys(rs.exact)) { // the same error every time
		r := rs.exact[p]
		if mode == ByIP {
			if _, err := netip.ParseAddr(p); err != nil {
				return nil, byIP(p)
			}
			if err := set(p, p, r); err != nil {
				return nil, err
			}
			continue
		}
		if err := set(registrableDomain(p), p, r); err != nil {
			return nil, err
		}
	}
	for _, w := range rs.wild {
		pattern := "*" + w.suffix
		if mode == ByIP {
			return nil, byIP(pattern)
		}
		probe := "fleetgate-probe" + w.suffix
		if registrableDomain(probe) == probe { // *.PUBLIC-SUFFIX: one quota per domain under it
			out.wild = append(out.wild, w)
			continue
		}
		if err := set(registrableDomain(probe), pattern, w.rule); err != nil {
			return nil, err
		}
	}
	return out, nil
}
