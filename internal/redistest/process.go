package redistest

import "os/exec"

// process is a started child process and the goroutine reaping it.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd.Wait has returned
	err  error         // the result of cmd.Wait; read it only after done is closed
}

// startProcess starts cmd and a goroutine that waits for it to exit. The
// goroutine ends when the process does; kill ends both.
func startProcess(cmd *exec.Cmd) (*process, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// kill sends SIGKILL, unless the process has already exited, and waits until
// it has been reaped.
func (p *process) kill() {
	// Kill fails only when the process has exited already; the reaping
	// goroutine closes done either way.
	_ = p.cmd.Process.Kill()
	<-p.done
}
