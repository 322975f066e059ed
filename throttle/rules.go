package throttle

import (
	"fmt"
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

// Parse adds one PATTERN=RULE spec (see ParseRules).
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
	if rest, ok := strings.CutPrefix(p, "*."); ok {
		name, err := normalizeHost(rest)
		if err != nil || strings.ContainsAny(name, "*") {
			return "", fmt.Errorf("%w: pattern %q is not *.DOMAIN", ErrBadRule, pattern)
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

// hasExplicit reports whether name has an exact or wildcard rule.
func (rs *Rules) hasExplicit(name string) bool {
	_, p, ok := rs.Lookup(name)
	return ok && p != DefaultPattern
}
