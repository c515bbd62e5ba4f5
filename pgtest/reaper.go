package pgtest

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// stopPostmasterSh stops the postmaster running in $dir/data, if any: an
// immediate shutdown, which also ends every backend, then SIGKILL if it
// has not exited (postmaster.pid gone) within 30 s.
const stopPostmasterSh = `
pid=$(head -n 1 "$dir/data/postmaster.pid" 2>/dev/null)
if [ -n "$pid" ] && kill -QUIT "$pid" 2>/dev/null; then
	i=0
	while [ -e "$dir/data/postmaster.pid" ] && kill -0 "$pid" 2>/dev/null && [ $i -lt 300 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	kill -KILL "$pid" 2>/dev/null
fi
`

// reaperScript waits for a line on stdin. "done" means the server was
// removed in-process. End of file means this process died without cleaning
// up — a panic, a test timeout, SIGINT, SIGKILL — so the script removes
// what it was told to: the postmaster (an immediate shutdown, which also
// ends every backend), the temp dir, the container, the network namespace.
const reaperScript = `
read -r line
[ "$line" = done ] && exit 0
dir=$PGTEST_REAP_DIR
if [ -n "$dir" ]; then` + stopPostmasterSh + `	rm -rf "$dir"
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

// sharedReaperScript is the watchdog of a shared server's directory
// $PGTEST_REAP_DIR (see share.go), which the binary that starts it has
// made (or checked) and whose reaper file it passes as fd 3: the script
// opens nothing by a name that another user could have planted. It takes
// the reaper lock and prints ok; or prints dup if another watchdog holds
// it, retry if the file is no longer the directory's (removed meanwhile),
// or noflock without the flock command. Then, in the background, every
// 0.2 s: once the go command ($PGTEST_SHARE_PID, started at
// $PGTEST_SHARE_START) is gone, it takes the directory's lock and, if it
// can take users exclusively (no test binary uses the server), removes
// the server and exits.
const sharedReaperScript = `
command -v flock >/dev/null || { echo noflock; exit 0; }
dir=$PGTEST_REAP_DIR
flock -n -x 3 || { echo dup; exit 0; }
[ "$dir/reaper" -ef "/proc/$$/fd/3" ] || { echo retry; exit 0; }
echo ok
alive() {
	{ read -r line < "/proc/$PGTEST_SHARE_PID/stat"; } 2>/dev/null || return 1
	set -- ${line##*")"}
	[ "$1" != Z ] || return 1
	shift 19
	[ "$1" = "$PGTEST_SHARE_START" ]
}
(
	while :; do
		if ! alive; then
			exec 4>>"$dir/lock" 5>>"$dir/users" || exit 0
			flock -x 4
			if flock -n -x 5; then
				rm -f "$dir/port"` + stopPostmasterSh + `				rm -rf "$dir"
				exit 0
			fi
			exec 4>&- 5>&-
		fi
		sleep 0.2
	done
) </dev/null >/dev/null 2>&1 &
`

// ensureReaper makes sure that the shared server directory sp has its
// watchdog, starting one if not; it makes the directory if it is not
// there.
func (sp shareSpot) ensureReaper() error {
	for range 3 {
		reaper, err := sp.openReaper()
		if errors.Is(err, errSpotGone) {
			continue
		}
		if err != nil {
			return err
		}
		cmd := exec.Command("/bin/sh", "-c", sharedReaperScript)
		cmd.Env = append(os.Environ(), "PGTEST_REAP_DIR="+sp.dir,
			"PGTEST_SHARE_PID="+strconv.Itoa(sp.parent.pid), "PGTEST_SHARE_START="+sp.parent.start)
		cmd.ExtraFiles = []*os.File{reaper} // fd 3
		// Its own process group, so a terminal's SIGINT does not kill it.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.WaitDelay = 10 * time.Second
		out, err := cmd.Output()
		_ = reaper.Close() // the watchdog's copy keeps the lock
		switch strings.TrimSpace(string(out)) {
		case "ok", "dup":
			return nil
		case "retry":
			continue
		case "noflock":
			return fmt.Errorf("%w: no flock command (util-linux)", errNoShare)
		}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return fmt.Errorf("watchdog: %v (output %q)", err, out)
	}
	return errors.New("watchdog: the directory was removed three times in a row while starting one")
}
