package pgtest

import (
	"io"
	"os"
	"os/exec"
	"syscall"
)

// reaperScript waits for a line on stdin. "done" means the server was
// removed in-process. End of file means this process died without cleaning
// up — a panic, a test timeout, SIGINT, SIGKILL — so the script removes
// what it was told to: the postmaster (an immediate shutdown, which also
// ends every backend), the temp dir, the container, the network namespace.
const reaperScript = `
read -r line
[ "$line" = done ] && exit 0
dir=$PGTEST_REAP_DIR
if [ -n "$dir" ]; then
	pid=$(head -n 1 "$dir/data/postmaster.pid" 2>/dev/null)
	if [ -n "$pid" ] && kill -QUIT "$pid" 2>/dev/null; then
		i=0
		while [ -e "$dir/data/postmaster.pid" ] && kill -0 "$pid" 2>/dev/null && [ $i -lt 300 ]; do
			sleep 0.1
			i=$((i + 1))
		done
		kill -KILL "$pid" 2>/dev/null
	fi
	rm -rf "$dir"
fi
if [ -n "$PGTEST_REAP_NETNS" ]; then
	ip netns del "$PGTEST_REAP_NETNS" 2>/dev/null
fi
if [ -n "$PGTEST_REAP_CONTAINER" ] && command -v docker >/dev/null; then
	docker rm -f -v "$PGTEST_REAP_CONTAINER" >/dev/null 2>&1
fi
exit 0
`

// reaper is the watchdog process of one throwaway server: it outlives this
// process only to remove the server should this process die first.
type reaper struct {
	cmd *exec.Cmd
	w   io.WriteCloser
}

// startReaper starts a watchdog that removes dir (and the postmaster running
// in dir/data), the Docker container id or the network namespace netns once
// this process is gone. Empty arguments name nothing to remove.
func startReaper(dir, container, netns string) (*reaper, error) {
	return startWatchdog(reaperScript, "PGTEST_REAP_DIR="+dir, "PGTEST_REAP_CONTAINER="+container, "PGTEST_REAP_NETNS="+netns)
}

// startWatchdog runs script, which reads one line from stdin (see
// reaperScript), with env added to this process's environment.
func startWatchdog(script string, env ...string) (*reaper, error) {
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Env = append(os.Environ(), env...)
	// Its own process group, so a terminal's SIGINT does not kill it
	// together with the test binary it watches.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	w, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &reaper{cmd: cmd, w: w}, nil
}

// dismiss tells the watchdog that the server was removed and waits for it.
func (r *reaper) dismiss() {
	_, _ = io.WriteString(r.w, "done\n")
	_ = r.w.Close()
	_ = r.cmd.Wait()
}
