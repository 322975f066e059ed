package redistest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// startTimeout bounds how long a started redis-server may take to answer.
	startTimeout = 10 * time.Second
	// startAttempts is how many fresh ports StartServer tries when another
	// process takes the chosen port before redis-server binds it.
	startAttempts = 5
	// restartTimeout bounds how long Restart retries a port still in use.
	restartTimeout = 5 * time.Second
	// maxClusterPort keeps the cluster bus port (port+10000) a valid port.
	maxClusterPort = 55535
	// logTailLines is how much of redis.log a failure message quotes.
	logTailLines = 30
)

// errAddrInUse reports that redis-server could not bind its port.
var errAddrInUse = errors.New("address already in use")

// Server is a redis-server process started by StartServer. It listens on
// Addr for its whole life, across Kill and Restart.
//
// Its methods are safe for concurrent use; Kill and Restart are serialized.
// Like testing.TB.Fatal they must be called from the goroutine running the
// test.
type Server struct {
	// Addr is the server's address, "127.0.0.1:PORT".
	Addr string

	bin  string   // path of redis-server
	dir  string   // the server's own temporary directory
	port int      // fixed once StartServer returns
	args []string // arguments after the defaults, including extraArgs
	conf string   // a config file's text, for a Sentinel (which needs one); "" for none

	mu      sync.Mutex
	proc    *process // nil while the server is killed
	release func()   // non-nil while the port is reserved after Kill
}

// StartServer starts a standalone redis-server on a free loopback port and
// waits, for at most 10 seconds, until it answers; on timeout it fails tb
// with the tail of the server's log. The server runs in its own directory
// (tb.TempDir()) with its log in redis.log there, with persistence disabled
// (--save "" --appendonly no) and protected mode off, bound to 127.0.0.1.
//
// extraArgs are appended to redis-server's command line, as pairs such as
// "--maxmemory", "10mb", and override the defaults.
//
// A Cleanup registered on tb kills the server when the test ends, also when
// it fails. StartServer fails tb if redis-server is not on PATH.
func StartServer(tb testing.TB, extraArgs ...string) *Server {
	tb.Helper()
	return startServer(tb, false, extraArgs)
}

// startServer starts a Server; with cluster set it enables cluster mode and
// picks a port whose cluster bus port, port+10000, is free as well.
func startServer(tb testing.TB, cluster bool, extraArgs []string) *Server {
	tb.Helper()
	return launchNew(tb, &Server{bin: lookBinary(tb, "redis-server"), dir: tb.TempDir()}, cluster, extraArgs)
}

// launchNew starts s, whose bin, dir and conf are set, on a free port.
func launchNew(tb testing.TB, s *Server, cluster bool, extraArgs []string) *Server {
	tb.Helper()
	if cluster {
		s.args = append(s.args,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(s.dir, "nodes.conf"))
	}
	s.args = append(s.args, extraArgs...)
	// Registered after TempDir, so it runs before the directory is removed.
	tb.Cleanup(s.stop)

	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	for range startAttempts {
		var port int
		port, err = freePort(cluster)
		if err != nil {
			tb.Fatalf("redistest: pick a free port: %v", err)
		}
		s.port = port
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if err = s.launch(); !errors.Is(err, errAddrInUse) {
			break
		}
	}
	if err != nil {
		tb.Fatalf("redistest: start redis-server: %v", err)
	}
	return s
}

// Client returns a go-redis client for the server with default options, but
// for ContextTimeoutEnabled (which throttle.NewRedisStore requires). A
// Cleanup registered on tb closes it. The client keeps working across Kill
// and Restart: it reconnects once the server answers again.
func (s *Server) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true})
	tb.Cleanup(func() { closeClient(tb, rdb) })
	return rdb
}

// URL returns the server's address as a go-redis URL, "redis://127.0.0.1:PORT/0",
// which redis.ParseURL accepts.
func (s *Server) URL() string {
	return "redis://" + s.Addr + "/0"
}

// Kill sends SIGKILL to the server and waits until it has exited, so that
// connections to Addr are refused. The server saves nothing. Until Restart
// the port stays bound (not listening) by the test process, so that no other
// test or outgoing connection takes it. Kill on a killed server does nothing.
func (s *Server) Kill(tb testing.TB) {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	s.proc.kill()
	s.proc = nil
	s.release = reservePort(s.port)
}

// Restart starts the server again on the same port and waits, for at most
// 10 seconds, until it answers. A running server is killed first. The new
// server starts empty: the defaults disable persistence (extraArgs that
// enable it are honoured, and the directory is kept). If the port is still
// in use Restart retries for a few seconds; on failure it fails tb with the
// tail of the server's log.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.kill()
		s.proc = nil
	}
	s.releasePort()
	deadline := time.Now().Add(restartTimeout)
	for {
		err := s.launch()
		if err == nil {
			return
		}
		if !errors.Is(err, errAddrInUse) || time.Now().After(deadline) {
			tb.Fatalf("redistest: restart redis-server on %s: %v", s.Addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop kills the server and drops the port reservation; it is the Cleanup
// registered by StartServer.
func (s *Server) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.kill()
		s.proc = nil
	}
	s.releasePort()
}

// releasePort drops the reservation taken by Kill, if any. s.mu must be held.
func (s *Server) releasePort() {
	if s.release != nil {
		s.release()
		s.release = nil
	}
}

// launch starts redis-server on s.port and waits until it answers. On
// failure no process is left running and the error quotes the log written by
// this attempt; it wraps errAddrInUse when the port was taken. s.mu must be
// held.
func (s *Server) launch() error {
	logPath := filepath.Join(s.dir, "redis.log")
	var logOffset int64 // redis-server appends: quote only this attempt
	if fi, err := os.Stat(logPath); err == nil {
		logOffset = fi.Size()
	}
	// Output before the log file is open (bad arguments, say) goes here. An
	// *os.File is handed to the child as is: no copying goroutine to wait for.
	out, err := os.OpenFile(filepath.Join(s.dir, "redis.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()

	var args []string
	if s.conf != "" {
		// Written once: a Sentinel rewrites it with what it learns, and a
		// restarted one reads that back.
		conf := filepath.Join(s.dir, "sentinel.conf")
		if _, err := os.Stat(conf); err != nil {
			if err := os.WriteFile(conf, []byte(s.conf), 0o600); err != nil {
				return err
			}
		}
		args = []string{conf, "--sentinel"}
	}
	args = append(args, []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--protected-mode", "no",
		"--dir", s.dir,
		"--logfile", logPath,
		"--daemonize", "no",
		"--save", "",
		"--appendonly", "no",
	}...)
	args = append(args, s.args...)
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()
	p, err := startProcess(cmd)
	if err != nil {
		return fmt.Errorf("run %s: %w", s.bin, err)
	}
	if err := waitReady(s.Addr, p); err != nil {
		p.kill()
		tail := s.logTail(logPath, logOffset)
		if strings.Contains(tail, "Address already in use") {
			err = fmt.Errorf("%w: %w", errAddrInUse, err)
		}
		return fmt.Errorf("%s: %w\n--- %s (tail) ---\n%s", s.Addr, err, logPath, tail)
	}
	s.proc = p
	return nil
}

// waitReady polls addr until the redis-server of p answers, p exits, or
// startTimeout passes. The server must report p's process id, so that a
// server of another test that grabbed the port is never mistaken for p.
func waitReady(addr string, p *process) error {
	want := strconv.Itoa(p.cmd.Process.Pid)
	deadline := time.Now().Add(startTimeout)
	var lastErr error
	for {
		reply, err := command(addr, time.Second, "INFO", "server")
		if err == nil {
			if pid, _ := infoField(reply, "process_id"); pid == want {
				return nil
			}
			err = fmt.Errorf("%s is answered by another redis-server", addr)
		}
		lastErr = err
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server did not answer within %v: %w", startTimeout, lastErr)
		}
		select {
		case <-p.done:
			return fmt.Errorf("redis-server exited before answering (%v)", p.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// logTail returns the last lines that redis-server wrote to logPath after
// offset, and to redis.out.
func (s *Server) logTail(logPath string, offset int64) string {
	var b strings.Builder
	if data, err := os.ReadFile(logPath); err == nil && int64(len(data)) >= offset {
		b.WriteString(lastLines(string(data[offset:]), logTailLines))
	}
	if data, err := os.ReadFile(filepath.Join(s.dir, "redis.out")); err == nil && len(data) > 0 {
		b.WriteString("--- redis.out (tail) ---\n")
		b.WriteString(lastLines(string(data), logTailLines))
	}
	return b.String()
}

// lastLines returns at most the last n lines of text.
func lastLines(text string, n int) string {
	lines := strings.SplitAfter(text, "\n")
	if last := len(lines) - 1; lines[last] == "" {
		lines = lines[:last]
	}
	return strings.Join(lines[max(0, len(lines)-n):], "")
}

// freePort returns a loopback TCP port that was free a moment ago. With
// cluster set, port+10000 (the cluster bus port) was free too and is a valid
// port.
func freePort(cluster bool) (int, error) {
	var lastErr error
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		if !cluster {
			return port, l.Close()
		}
		if port >= maxClusterPort {
			_ = l.Close()
			lastErr = fmt.Errorf("port %d leaves no room for its cluster bus port", port)
			continue
		}
		bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		_ = l.Close()
		if err != nil {
			lastErr = err
			continue
		}
		return port, bus.Close()
	}
	return 0, fmt.Errorf("no free port pair for a cluster node: %w", lastErr)
}

// closeClient closes a client in a Cleanup, tolerating one the test closed.
func closeClient(tb testing.TB, c interface{ Close() error }) {
	if err := c.Close(); err != nil && !errors.Is(err, redis.ErrClosed) {
		tb.Errorf("redistest: close client: %v", err)
	}
}
