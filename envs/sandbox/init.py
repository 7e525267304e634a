"""pid 1 of a fresh container (stdlib only; executed by the container's ``python3 -I -S -B``, never imported).

bubblewrap's own pid 1 runs as the run's uid and stays dumpable, and it holds the run's stdin, stdout and
stderr and the eventfd that carries the exit status out: a program could read its stdin after closing its own
(the hidden tests and the nonce a harness hides from the code it tests), write into its memory through
``/proc/1/mem`` to forge the output or the exit status, or clear its parent-death signal and outlive the run.
So a fresh container starts this instead (``bwrap --as-pid-1``): it makes itself non-dumpable (its ``/proc``
files are then the kernel's, not the run's uid's), forks the program, closes its own copies of stdin, stdout
and stderr, reaps every process that is orphaned to it, and exits with the program's status (128 + N when a
signal N killed it, as bubblewrap reports). Every signal is left at its default, which pid 1 of a namespace
ignores when it comes from inside; when it exits, the kernel kills all that is left in the namespace, and it
dies with bubblewrap (``--die-with-parent``), which the host kills at the timeout.

    python3 -I -S -B /.sandbox/init.py PROGRAM ARGS...
"""

import ctypes
import os
import signal
import sys

_PR_SET_DUMPABLE = 4


def main(argv):
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        os.write(2, b"sandbox init: cannot make itself non-dumpable\n")
        os._exit(125)
    # Python's own handlers: SIGINT back to the default (pid 1 then ignores it from inside); the program
    # gets SIGPIPE and SIGXFSZ (the file-size limit) at their defaults, as any program started by a shell
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    program = os.fork()
    if program == 0:
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(argv[0], argv)
        except OSError as e:
            os.write(2, f"sandbox init: cannot execute {argv[0]}: {e.strerror}\n".encode())
        os._exit(127)
    for fd in (0, 1, 2):
        os.close(fd)
    while True:
        pid, status = os.wait()
        if pid == program:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)


if __name__ == "__main__":
    main(sys.argv[1:])
