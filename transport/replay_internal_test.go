package transport

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/throttle"
)

// When a late connection finds no slot, an HTTP/1 connection's writes are
// made to fail, so that nothing is written; an HTTP/2 connection carries
// other requests' streams and keeps working: the cancelled context alone
// stops the request there.
func TestAStoppedRequestLeavesAnHTTP2ConnectionWorking(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	pool := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs

	for _, tc := range []struct {
		proto      string // offered
		writesWork bool
	}{
		{"h2", true},
		{"http/1.1", false}, // the server then negotiates none: HTTP/1

	} {
		t.Run(tc.proto, func(t *testing.T) {
			rules, err := throttle.ParseRules("*=2/1h,gap=30m")
			require.NoError(t, err)
			thr, err := throttle.New(rules, throttle.WithMargin(throttle.MinStale))
			require.NoError(t, err)
			t.Cleanup(func() { _ = thr.Close() })
			tr := New(nil, thr, WithoutRetries())

			conn, err := tls.Dial("tcp", srv.Listener.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "example.com", NextProtos: []string{tc.proto}})
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close() })
			require.Equal(t, tc.proto == "h2", conn.ConnectionState().NegotiatedProtocol == "h2")

			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			actx, g := tr.guard(ctx, "example.com")
			res, err := thr.ReserveN(ctx, "example.com", 1)
			require.NoError(t, err)
			g.res = res
			_, err = thr.ReserveN(t.Context(), "example.com", 1) // the next slot, 30 minutes on
			require.NoError(t, err)
			time.Sleep(3 * throttle.MinStale) // the connection comes too late for the slot
			require.True(t, res.Stale())

			g.gotConn(httptrace.GotConnInfo{Conn: conn})
			_, ranOut, err := g.stopped()
			require.False(t, ranOut, "the caller's deadline, not the attempt's")
			require.ErrorIs(t, err, context.DeadlineExceeded, "no slot before the deadline")
			require.Error(t, actx.Err(), "the attempt's context is cancelled")

			_, err = conn.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
			if tc.writesWork {
				require.NoError(t, err, "the HTTP/2 connection's other streams go on")
			} else {
				var ne net.Error
				require.ErrorAs(t, err, &ne)
				require.True(t, ne.Timeout(), "the HTTP/1 connection's write fails before a byte leaves: %v", err)
			}
		})
	}
}
