/* Client requests to callgrind, callable from Python through ctypes (see program.py).
 * Outside valgrind every request is a no-op. Built by the instructions case with the system's C
 * compiler against valgrind's own header, which ships with the valgrind package. */
#include <valgrind/callgrind.h>
#include <valgrind/valgrind.h>

int bench_on_valgrind(void) { return RUNNING_ON_VALGRIND; }
void bench_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void bench_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
void bench_zero(void) { CALLGRIND_ZERO_STATS; }
void bench_dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
