/* An LD_PRELOAD library that makes file operations fail on purpose, for the
 * fault-injection tests (ctest label `faults`). It acts only on files whose
 * path contains $LAMP_FAULT_PATH, read at every call, so a test can change
 * the fault between two writes with setenv():
 *
 *   LAMP_FAULT_WRITE_AFTER=N     write() fails with ENOSPC once the file
 *                                offset reaches N (the write that crosses N
 *                                is cut short there): a disk that is full
 *                                after N bytes of the file.
 *   LAMP_FAULT_WRITE_CHUNK=N     write() writes at most N bytes per call.
 *   LAMP_FAULT_WRITE_DELAY_US=N  write() sleeps N microseconds first.
 *   LAMP_FAULT_FSYNC=1           fsync() fails with EIO.
 *   LAMP_FAULT_CLOSE=1           close() closes, then reports EIO (as NFS
 *                                does for a write that failed late).
 *   LAMP_FAULT_OPEN=1            open() with O_CREAT fails with EACCES.
 *   LAMP_FAULT_OPEN=2            only open() with O_CREAT | O_EXCL fails so:
 *                                files that exist open, none can be created
 *                                (a folder made read-only, a lock file left
 *                                in it).
 *   LAMP_FAULT_RAISE_ON=TEXT     after the first write() whose data holds
 *                                TEXT ("*": any write), the process raises
 *                                LAMP_FAULT_RAISE_SIGNAL (default SIGINT)
 *                                LAMP_FAULT_RAISE_COUNT times (default 1):
 *                                a signal at an exact point of a run (a JSON
 *                                log record, a checkpoint being written).
 *
 * And threads, for any path: after lamp_fail_threads_after(N), N more
 * pthread_create() calls start their thread and every later one fails with
 * EAGAIN (as under `ulimit -u`), until lamp_fail_threads_after(-1).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

/* Lets a test check that it runs with this library preloaded. */
int lamp_fail_io_loaded(void) {
  return 1;
}

static const char* pattern(void) {
  const char* p = getenv("LAMP_FAULT_PATH");
  return p != NULL && *p != '\0' ? p : NULL;
}

static long long setting(const char* name) {
  const char* value = getenv(name);
  return value != NULL && *value != '\0' ? atoll(value) : -1;
}

static int fd_matches(int fd) {
  const char* p = pattern();
  if (p == NULL) {
    return 0;
  }
  char link[64];
  char target[4096];
  snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof(target) - 1);
  if (n <= 0) {
    return 0;
  }
  target[n] = '\0';
  return strstr(target, p) != NULL;
}

static int path_matches(const char* path) {
  const char* p = pattern();
  return p != NULL && path != NULL && strstr(path, p) != NULL;
}

typedef ssize_t (*write_fn)(int, const void*, size_t);
typedef int (*fd_fn)(int);
typedef int (*open_fn)(const char*, int, ...);
typedef int (*openat_fn)(int, const char*, int, ...);

/* The next definition of `name` (libc's), looked up once. */
#define REAL(name, type)                 \
  static type real = NULL;               \
  if (real == NULL) {                    \
    real = (type)dlsym(RTLD_NEXT, name); \
  }

/* Whether `data` holds LAMP_FAULT_RAISE_ON's text ("*": always). */
static int holds_raise_text(const void* data, size_t count) {
  const char* text = getenv("LAMP_FAULT_RAISE_ON");
  if (text == NULL || *text == '\0') {
    return 0;
  }
  if (strcmp(text, "*") == 0) {
    return 1;
  }
  return memmem(data, count, text, strlen(text)) != NULL;
}

/* LAMP_FAULT_RAISE_ON: raises the signal once per process. */
static void raise_after(const void* data, size_t count) {
  static int raised = 0;
  if (raised || !holds_raise_text(data, count)) {
    return;
  }
  raised = 1;
  const long long signal_number = setting("LAMP_FAULT_RAISE_SIGNAL");
  const long long times = setting("LAMP_FAULT_RAISE_COUNT");
  for (long long i = 0; i < (times > 0 ? times : 1); ++i) {
    raise(signal_number > 0 ? (int)signal_number : SIGINT);
  }
}

/* write() for a file LAMP_FAULT_PATH names: the faults it asks for. */
static ssize_t write_checked(int fd, const void* data, size_t count,
                             write_fn real) {
  const long long delay = setting("LAMP_FAULT_WRITE_DELAY_US");
  const long long chunk = setting("LAMP_FAULT_WRITE_CHUNK");
  const long long limit = setting("LAMP_FAULT_WRITE_AFTER");
  if (delay > 0) {
    usleep((useconds_t)delay);
  }
  if (chunk > 0 && count > (size_t)chunk) {
    count = (size_t)chunk;
  }
  if (limit >= 0) {
    const off_t at = lseek(fd, 0, SEEK_CUR);
    if (at >= limit) {
      errno = ENOSPC;
      return -1;
    }
    if ((long long)at + (long long)count > limit) {
      count = (size_t)(limit - at);
    }
  }
  return real(fd, data, count);
}

ssize_t write(int fd, const void* data, size_t count) {
  REAL("write", write_fn);
  if (fd_matches(fd)) {
    const ssize_t written = write_checked(fd, data, count, real);
    raise_after(data, count);
    return written;
  }
  return real(fd, data, count);
}

/* libstdc++'s filebuf writes a chunk of 1024 bytes or more together with
 * what it buffered through writev(): a long JSON record (a run record with
 * long paths) arrives here, not in write(). Only LAMP_FAULT_RAISE_ON applies
 * to it. */
typedef ssize_t (*writev_fn)(int, const struct iovec*, int);

ssize_t writev(int fd, const struct iovec* iov, int iovcnt) {
  REAL("writev", writev_fn);
  const ssize_t written = real(fd, iov, iovcnt);
  if (written > 0 && fd_matches(fd)) {
    for (int i = 0; i < iovcnt; ++i) {
      raise_after(iov[i].iov_base, iov[i].iov_len);
    }
  }
  return written;
}

int fsync(int fd) {
  REAL("fsync", fd_fn);
  if (setting("LAMP_FAULT_FSYNC") > 0 && fd_matches(fd)) {
    errno = EIO;
    return -1;
  }
  return real(fd);
}

int close(int fd) {
  REAL("close", fd_fn);
  const int fail = setting("LAMP_FAULT_CLOSE") > 0 && fd_matches(fd);
  const int rc = real(fd);
  if (fail && rc == 0) {
    errno = EIO;
    return -1;
  }
  return rc;
}

/* Sets errno and returns 1 when this open must fail. */
static int refuse_open(const char* path, int flags) {
  const long long open = setting("LAMP_FAULT_OPEN");
  if ((flags & O_CREAT) != 0 &&
      (open == 1 || (open == 2 && (flags & O_EXCL) != 0)) &&
      path_matches(path)) {
    errno = EACCES;
    return 1;
  }
  return 0;
}

/* The optional mode argument of the open calls. */
#define MODE_ARGUMENT(flags, mode)              \
  mode_t mode = 0;                              \
  if (((flags) & (O_CREAT | O_TMPFILE)) != 0) { \
    va_list args;                               \
    va_start(args, flags);                      \
    mode = (mode_t)va_arg(args, int);           \
    va_end(args);                               \
  }

int open(const char* path, int flags, ...) {
  REAL("open", open_fn);
  MODE_ARGUMENT(flags, mode);
  return refuse_open(path, flags) ? -1 : real(path, flags, mode);
}

int open64(const char* path, int flags, ...) {
  REAL("open64", open_fn);
  MODE_ARGUMENT(flags, mode);
  return refuse_open(path, flags) ? -1 : real(path, flags, mode);
}

int openat(int dir, const char* path, int flags, ...) {
  REAL("openat", openat_fn);
  MODE_ARGUMENT(flags, mode);
  return refuse_open(path, flags) ? -1 : real(dir, path, flags, mode);
}

/* pthread_create() calls left to start before the rest fail; -1: no limit. */
static long long threads_left = -1;

void lamp_fail_threads_after(long long n) {
  __atomic_store_n(&threads_left, n, __ATOMIC_SEQ_CST);
}

typedef int (*pthread_create_fn)(pthread_t*, const pthread_attr_t*,
                                 void* (*)(void*), void*);

int pthread_create(pthread_t* thread, const pthread_attr_t* attr,
                   void* (*start)(void*), void* arg) {
  REAL("pthread_create", pthread_create_fn);
  long long left = __atomic_load_n(&threads_left, __ATOMIC_SEQ_CST);
  while (left >= 0) {
    if (left == 0) {
      return EAGAIN;
    }
    if (__atomic_compare_exchange_n(&threads_left, &left, left - 1, 0,
                                    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
      break;
    }
  }
  return real(thread, attr, start, arg);
}
