// Runs a list of compiled tinygrad CPU kernels in one call, on a pool of threads.
// Used by workers/cpu_graph.py; built into a shared library on first use (see there for the command table layout).
//
// The calling thread is thread 0. A kernel split across cores (tinygrad's core_id argument, nthreads > 1)
// runs its core ids round-robin on all threads; every other kernel runs on thread 0 alone. Between split
// kernels the other threads wait on a sequence number (spinning, then yielding the core), and they sleep on a
// semaphore between runs, so an idle server uses no CPU.
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdint.h>
#include <string.h>

#define MAX_ARGS 24
#define STRIDE (2 + MAX_ARGS)
#define MAX_THREADS 64
#define SPINS_BEFORE_YIELD 4000

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ volatile("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

typedef void (*kernel_fn)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);

static int n_threads = 1;
static pthread_t threads[MAX_THREADS];
static sem_t wake[MAX_THREADS];
static const uint64_t *volatile current;  // the split command being run; NULL ends a run
static int64_t seq;                       // bumped (release) to publish `current`
static int done;                          // helpers that finished `current`

static void run_share(const uint64_t *cmd, int tid) {
  kernel_fn fn = (kernel_fn)(uintptr_t)cmd[0];
  int ncores = (int)(cmd[1] & 0xffff), core_arg = (int)((cmd[1] >> 16) & 0xffff) - 1;
  uint64_t a[MAX_ARGS];
  memcpy(a, cmd + 2, sizeof(a));
  for (int core = tid; core < (ncores > 0 ? ncores : 1); core += n_threads) {
    if (core_arg >= 0) a[core_arg] = (uint64_t)core;
    fn(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11],
       a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23]);
  }
}

static void wait_until_seq_passes(int64_t seen) {
  for (int spins = 0; __atomic_load_n(&seq, __ATOMIC_ACQUIRE) == seen; spins++) {
    if (spins < SPINS_BEFORE_YIELD) CPU_RELAX(); else sched_yield();
  }
}

static void wait_for_helpers(void) {
  for (int spins = 0; __atomic_load_n(&done, __ATOMIC_ACQUIRE) < n_threads - 1; spins++) {
    if (spins < SPINS_BEFORE_YIELD) CPU_RELAX(); else sched_yield();
  }
}

static void *helper_main(void *arg) {
  int tid = (int)(intptr_t)arg;
  int64_t seen = 0;
  for (;;) {
    while (sem_wait(&wake[tid]) != 0) {}
    for (;;) {
      wait_until_seq_passes(seen);
      seen = __atomic_load_n(&seq, __ATOMIC_ACQUIRE);
      const uint64_t *cmd = current;
      if (cmd) run_share(cmd, tid);
      __atomic_fetch_add(&done, 1, __ATOMIC_RELEASE);
      if (!cmd) break;
    }
  }
  return 0;
}

// main thread: hand `cmd` (or NULL: end of run) to every helper, do thread 0's share, wait for theirs
static void publish(const uint64_t *cmd) {
  current = cmd;
  __atomic_store_n(&done, 0, __ATOMIC_RELAXED);
  __atomic_add_fetch(&seq, 1, __ATOMIC_RELEASE);
  if (cmd) run_share(cmd, 0);
  wait_for_helpers();
}

int tv_start(int nthreads) {
  if (nthreads < 1) nthreads = 1;
  if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;
  if (n_threads > 1) return n_threads;  // already started
  for (int t = 1; t < nthreads; t++) {
    if (sem_init(&wake[t], 0, 0) != 0) return n_threads;
    pthread_attr_t attr;  // the kernels keep panels on the stack (~300 KB at K = 14336): not the C library's default
    if (pthread_attr_init(&attr) != 0 || pthread_attr_setstacksize(&attr, 8 << 20) != 0) return n_threads;
    const int failed = pthread_create(&threads[t], &attr, helper_main, (void *)(intptr_t)t);
    pthread_attr_destroy(&attr);
    if (failed) return n_threads;
    pthread_detach(threads[t]);
    n_threads = t + 1;
  }
  return n_threads;
}

int tv_max_args(void) { return MAX_ARGS; }

void tv_run(const uint64_t *cmds, int n) {
  int helpers_awake = 0;
  for (int i = 0; i < n; i++) {
    const uint64_t *cmd = cmds + (int64_t)i * STRIDE;
    if (n_threads > 1 && (cmd[1] & 0xffff) > 1) {
      if (!helpers_awake) {
        for (int t = 1; t < n_threads; t++) sem_post(&wake[t]);
        helpers_awake = 1;
      }
      publish(cmd);
    } else {
      run_share(cmd, 0);
    }
  }
  if (helpers_awake) publish(0);
}
