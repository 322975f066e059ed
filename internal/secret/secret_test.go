package secret

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHide(t *testing.T) {
	long := strings.Repeat("Z", 150)
	for _, tt := range []struct {
		name, msg string
		passwords []string
		want      string
	}{
		{"an echo of AUTH", "ERR unknown command 'auth', with args beginning with: 'admin' 'Sup3rS3cret' ",
			[]string{"Sup3rS3cret"}, "ERR unknown command 'auth', with args beginning with: ***"},
		{"an echo cut short", "ERR unknown command 'auth', with args beginning with: 'admin' '" + long[:117],
			[]string{long}, "ERR unknown command 'auth', with args beginning with: ***"},
		{"a short password, quoted", "WRONGPASS for 'a' in 'a bad way'", []string{"a"}, "WRONGPASS for '***' in 'a bad way'"},
		{"a short password, bare", "dial a host", []string{"a"}, "dial a host"},
		{"a long password, bare", "dial tcp: lookup Sup3rS3cret-x: no such host", []string{"Sup3rS3cret-x"}, "dial tcp: lookup ***: no such host"},
		{"one password begins another", "pw Sup3rS3cret and Sup3rS3cret-sentinel",
			[]string{"Sup3rS3cret", "Sup3rS3cret-sentinel"}, "pw *** and ***"},
		{"no passwords", "dial tcp 10.0.0.1:26379: i/o timeout", nil, "dial tcp 10.0.0.1:26379: i/o timeout"},
		{"an echo, no password known", "all sentinels specified in configuration are unreachable: ERR unknown command 'auth', with args beginning with: 'S3ntinel-pw' ",
			nil, "all sentinels specified in configuration are unreachable: ERR unknown command 'auth', with args beginning with: ***"},
		{"empty passwords", "nothing to hide", []string{"", ""}, "nothing to hide"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, Hide(tt.msg, tt.passwords))
		})
	}
}
