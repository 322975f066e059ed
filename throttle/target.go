package throttle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
	"golang.org/x/net/publicsuffix"
)

// ErrBadTarget is wrapped by every error about a target name that cannot be
// used: empty, malformed, or not a host name or IP address.
var ErrBadTarget = errors.New("bad target")

// KeyMode says which requests share one quota.
type KeyMode int

const (
	// ByHost gives every host name (or IP) its own quota. The default.
	ByHost KeyMode = iota
	// ByDomain groups host names by registrable domain (eTLD+1, from the
	// public suffix list): www.example.co.uk and api.example.co.uk share
	// example.co.uk's quota. IPs stay as they are. A domain's rule is the
	// one its patterns set (example.co.uk, api.example.co.uk or
	// *.example.co.uk; New refuses patterns that set different rules for
	// one domain), else a wildcard over domains (*.co.uk), else the
	// default: the same in every process, whichever host comes first.
	ByDomain
	// ByIP groups host names by the lowest address they resolve to, since
	// bans are per IP. Resolutions are cached by the Throttler for a
	// minute, whatever the records' TTL. An address's rule is its exact
	// pattern (1.2.3.4=…) or the default; New refuses host name and
	// wildcard patterns, which cannot name an address.
	ByIP
)

// ParseKeyMode reads "host", "domain" or "ip".
func ParseKeyMode(s string) (KeyMode, error) {
	switch s {
	case "host":
		return ByHost, nil
	case "domain":
		return ByDomain, nil
	case "ip":
		return ByIP, nil
	}
	return 0, fmt.Errorf("key mode %q: want host, domain or ip", s)
}

// String returns the name ParseKeyMode reads.
func (m KeyMode) String() string {
	switch m {
	case ByDomain:
		return "domain"
	case ByIP:
		return "ip"
	}
	return "host"
}

// Normalize returns the canonical form of a host, a host:port, a bracketed
// IPv6 literal or an IP: lower case, port and trailing dot dropped,
// internationalised names in ASCII (punycode), IPv6 in its compressed form,
// an IPv4-mapped IPv6 address (::ffff:1.2.3.4) as its IPv4 address, and
// the other spellings resolvers accept for an IPv4 address (127.1,
// 2130706433, 0x7f.0.0.1: inet_aton's) as the dotted one. A name's labels
// hold letters, digits, '-' and '_' (names such as "my_host.example.com"
// are in DNS, and net/http fetches them). A name whose last label is a
// number and that is no such address is an error.
// It is what every quota is keyed by (before any grouping by KeyMode).
func Normalize(host string) (string, error) {
	return normalizeHost(host)
}

func normalizeHost(host string) (string, error) {
	h := strings.TrimSpace(host)
	if h == "" {
		return "", fmt.Errorf("%w: empty host", ErrBadTarget)
	}
	if strings.HasPrefix(h, "[") { // [v6] or [v6]:port, and nothing else
		end := strings.IndexByte(h, ']')
		if end < 0 {
			return "", fmt.Errorf("%w %q: unclosed '['", ErrBadTarget, trunc(host))
		}
		if rest := h[end+1:]; rest != "" {
			port, ok := strings.CutPrefix(rest, ":")
			if _, err := strconv.ParseUint(port, 10, 16); !ok || err != nil && port != "" {
				return "", fmt.Errorf("%w %q: bad port", ErrBadTarget, trunc(host))
			}
		}
		h = h[1:end]
		if a, err := netip.ParseAddr(h); err != nil || !a.Is6() {
			return "", fmt.Errorf("%w %q: brackets hold no IPv6 address", ErrBadTarget, trunc(host))
		}
	} else if hh, port, err := net.SplitHostPort(h); err == nil {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil && port != "" {
			return "", fmt.Errorf("%w %q: bad port", ErrBadTarget, trunc(host))
		}
		h = hh
	}
	if ip, isIP, err := asIP(host, h); isIP {
		return ip, err
	}
	h = strings.TrimSuffix(h, ".")
	if !utf8.ValidString(h) {
		return "", fmt.Errorf("%w %q: not valid UTF-8", ErrBadTarget, trunc(host))
	}
	ascii, err := hostIDNA.ToASCII(h)
	if err != nil {
		return "", fmt.Errorf("%w %q: not a host name or IP", ErrBadTarget, trunc(host))
	}
	if ascii != h {
		// The mapping may make an address of what was none before it:
		// full-width digits, an ideographic full stop.
		if ip, isIP, err := asIP(host, ascii); isIP {
			return ip, err
		}
		ascii = strings.TrimSuffix(ascii, ".")
	}
	if !validHostname(ascii) {
		return "", fmt.Errorf("%w %q: not a host name or IP", ErrBadTarget, trunc(host))
	}
	return strings.ToLower(ascii), nil
}

// asIP returns the IP address h (from host, for messages) is, in its
// canonical form, and whether it is one: an error when h ends in a number
// but is no IPv4 address.
func asIP(host, h string) (string, bool, error) {
	if ip, err := netip.ParseAddr(h); err == nil {
		// An IPv4-mapped IPv6 address is the IPv4 host it maps to.
		return ip.WithZone("").Unmap().String(), true, nil
	}
	h = strings.TrimSuffix(h, ".")
	if !endsInANumber(h) {
		return "", false, nil
	}
	// 127.1, 2130706433, 0x7f.1: the IPv4 forms of inet_aton, which
	// resolvers and browsers read as 127.0.0.1 (the WHATWG URL standard's
	// IPv4 parser); a name ending in a number is no DNS name.
	ip, ok := parseLegacyIPv4(h)
	if !ok {
		return "", true, fmt.Errorf("%w %q: ends in a number but is not an IPv4 address", ErrBadTarget, trunc(host))
	}
	return ip.String(), true, nil
}

// hostIDNA is idna.Lookup without its STD3 rules, which refuse '_': names
// such as "my_host.example.com" are in DNS, and net/http fetches them;
// and without its hyphen check, which refuses "--" as a label's third and
// fourth characters: "r4---sn-4g5ednsl.googlevideo.com" is in DNS too
// (validHostname still refuses a label that starts or ends with '-', and
// a bad "xn--" label still fails to decode). validHostname then admits
// letters, digits, '-' and '_' alone.
var hostIDNA = idna.New(idna.MapForLookup(), idna.BidiRule(), idna.StrictDomainName(false), idna.CheckHyphens(false))

// endsInANumber reports whether h's last label is a number, decimal or
// 0x-hexadecimal: h is then an IPv4 address or nothing (WHATWG URL, "ends
// in a number checker").
func endsInANumber(h string) bool {
	last := h[strings.LastIndexByte(h, '.')+1:]
	if last == "" {
		return false
	}
	if hex, ok := strings.CutPrefix(strings.ToLower(last), "0x"); ok {
		return strings.Trim(hex, "0123456789abcdef") == ""
	}
	return strings.Trim(last, "0123456789") == ""
}

// parseLegacyIPv4 reads the IPv4 forms inet_aton accepts: one to four
// parts, each decimal, octal (a leading 0) or hexadecimal (0x), the last
// filling the bytes the others leave.
func parseLegacyIPv4(h string) (netip.Addr, bool) {
	parts := strings.Split(h, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	nums := make([]uint64, len(parts))
	for i, p := range parts {
		base, digits := 10, p
		switch lp := strings.ToLower(p); {
		case strings.HasPrefix(lp, "0x"):
			base, digits = 16, lp[2:]
		case len(p) > 1 && p[0] == '0':
			base, digits = 8, p[1:]
		}
		if digits == "" {
			if base != 16 || p == "" { // "0x" alone is 0; an empty part is nothing
				return netip.Addr{}, false
			}
			digits = "0"
		}
		n, err := strconv.ParseUint(digits, base, 32)
		if err != nil {
			return netip.Addr{}, false
		}
		nums[i] = n
	}
	last := nums[len(nums)-1]
	if last >= 1<<(8*(5-len(nums))) {
		return netip.Addr{}, false
	}
	v := last
	for i, n := range nums[:len(nums)-1] {
		if n > 255 {
			return netip.Addr{}, false
		}
		v |= n << (8 * (3 - i))
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

// validHostname checks the letters-digits-hyphen rule (underscores allowed,
// as in real DNS names): labels of 1 to 63 bytes, 253 bytes in all.
func validHostname(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// registrableDomain returns eTLD+1 of a normalised name, or the name itself
// when it has none (an IP, "localhost", a public suffix).
func registrableDomain(name string) string {
	if _, err := netip.ParseAddr(name); err == nil {
		return name
	}
	d, err := publicsuffix.EffectiveTLDPlusOne(name)
	if err != nil {
		return name
	}
	return d
}

// resolveIP returns the lowest address host resolves to, so every process
// picks the same one from the same answer.
func resolveIP(ctx context.Context, r *net.Resolver, name string) (string, error) {
	if _, err := netip.ParseAddr(name); err == nil {
		return name, nil
	}
	addrs, err := r.LookupNetIP(ctx, "ip", name)
	if err != nil {
		return "", fmt.Errorf("resolve %q: %w", name, err)
	}
	if len(addrs) == 0 {
		return "", fmt.Errorf("resolve %q: no addresses", name)
	}
	best := addrs[0].Unmap()
	for _, a := range addrs[1:] {
		if a = a.Unmap(); a.Less(best) {
			best = a
		}
	}
	return best.String(), nil
}

func trunc(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
