/* Two ranks (this process and a fork) join over loopback with onebit's C ABI and allreduce: an
 * untagged sum, which is exact, and a tagged one, within the compression's bound. Exit 0 when both
 * ranks saw the right answers; the failing rank says what was wrong. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <onebit/onebit.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

enum { N = 4099 };

/* A port nobody listens on now (the kernel's choice). Another process could take it before rank 0
 * binds it; the test would then fail loudly at the bootstrap, not pass wrongly. */
static int free_port(void) {
  struct sockaddr_in address = {0};
  socklen_t length = sizeof address;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || bind(fd, (struct sockaddr*)&address, sizeof address) != 0 ||
      getsockname(fd, (struct sockaddr*)&address, &length) != 0) {
    perror("free_port");
    exit(2);
  }
  close(fd);
  return ntohs(address.sin_port);
}

static int fail(int rank, const char* what) {
  fprintf(stderr, "rank %d: FAIL: %s: %s\n", rank, what, onebit_last_error());
  return 1;
}

static int run_rank(int rank, const char* root) {
  static float exact[N], tagged[N];
  onebit_comm_t comm;
  if (onebit_comm_init(&comm, rank, 2, root) != ONEBIT_SUCCESS) return fail(rank, "onebit_comm_init");
  for (int i = 0; i < N; ++i) {
    exact[i] = (float)(i % 97) * (float)(rank + 1);
    tagged[i] = rank == 0 ? 1.0f : 3.0f;
  }
  if (onebit_allreduce(comm, exact, N, ONEBIT_FLOAT32, ONEBIT_SUM) != ONEBIT_SUCCESS)
    return fail(rank, "untagged onebit_allreduce");
  for (int i = 0; i < N; ++i) {
    if (exact[i] != (float)(i % 97) * 3.0f) {
      fprintf(stderr, "rank %d: FAIL: untagged sum [%d] = %g, want %g\n", rank, i, exact[i], (float)(i % 97) * 3.0f);
      return 1;
    }
  }
  if (onebit_tag("consumer.m", tagged, N, ONEBIT_FLOAT32) != ONEBIT_SUCCESS) return fail(rank, "onebit_tag");
  if (onebit_allreduce(comm, tagged, N, ONEBIT_FLOAT32, ONEBIT_AVG) != ONEBIT_SUCCESS)
    return fail(rank, "tagged onebit_allreduce");
  /* Every element of each rank is one constant: sign and scale carry it exactly, so the average is 2. */
  for (int i = 0; i < N; ++i) {
    if (tagged[i] < 1.999f || tagged[i] > 2.001f) {
      fprintf(stderr, "rank %d: FAIL: tagged average [%d] = %g, want 2\n", rank, i, tagged[i]);
      return 1;
    }
  }
  onebit_untag(tagged);
  onebit_comm_destroy(comm);
  return 0;
}

int main(void) {
  char root[64];
  snprintf(root, sizeof root, "127.0.0.1:%d", free_port());
  pid_t child = fork();
  if (child < 0) {
    perror("fork");
    return 2;
  }
  if (child == 0) _exit(run_rank(1, root));
  int status = 0, mine = run_rank(0, root);
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "rank 1 failed (wait status %d)\n", status);
    return 1;
  }
  if (mine != 0) return mine;
  printf("OK: 2 ranks, libonebit version code %d: untagged sum exact, tagged average within bound\n", onebit_version());
  return 0;
}
