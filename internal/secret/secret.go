// Package secret takes passwords out of text that is about to be logged or
// returned in an error.
package secret

import (
	"cmp"
	"slices"
	"strings"
)

// echo is how Redis quotes the arguments of a command it does not know:
// "ERR unknown command 'auth', with args beginning with: 'user'
// 'password'". It cuts them at 128 bytes, so a longer password shows in
// part, which no replacement of the whole password would find.
const echo = "with args beginning with:"

// minBare is the shortest password that is replaced wherever it appears,
// not only where it stands quoted: replacing "a" everywhere would garble
// the text and point at the password.
const minBare = 8

// Hide returns msg with passwords taken out, each shown as "***":
// everything after a Redis echo of arguments (see echo), even with no
// passwords given, as the arguments may hold one the caller does not know
// of (a Sentinel's, say); every password that stands in single quotes;
// and every password of minBare bytes or more wherever it appears, the
// longest first (one may begin with another). Empty passwords are ignored.
func Hide(msg string, passwords []string) string {
	if i := strings.Index(msg, echo); i >= 0 {
		msg = msg[:i+len(echo)] + " ***"
	}
	ps := slices.DeleteFunc(slices.Clone(passwords), func(p string) bool { return p == "" })
	if len(ps) == 0 {
		return msg
	}
	slices.SortFunc(ps, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	for _, p := range ps {
		msg = strings.ReplaceAll(msg, "'"+p+"'", "'***'")
		if len(p) >= minBare {
			msg = strings.ReplaceAll(msg, p, "***")
		}
	}
	return msg
}
