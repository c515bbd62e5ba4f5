package schedule

// SetAfterPeek makes j's Starts call f after they read the slot and before
// they take the job's lease: a replica stalled there.
func SetAfterPeek(j *Job, f func()) { j.hooks.afterPeek = f }

// SetBeforeMark makes j's Starts call f after they took the job's lease
// and before they mark the run.
func SetBeforeMark(j *Job, f func()) { j.hooks.beforeMark = f }

// SetWaiting makes j's Starts call f when they go to wait for another
// slot's run that holds the job.
func SetWaiting(j *Job, f func()) { j.hooks.waiting = f }
