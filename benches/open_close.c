/* What one open and close of a file costs, without a program around it: opens FILE
 * read-only and closes it N times, and prints the mean in microseconds. Used for the
 * round-trip figures in docs/benchmarks.md ("Where the remaining warm and cold costs
 * go"); run it on a file in the mount and on one in ext4 in the same minute.
 *
 *     gcc -O2 -o /tmp/open_close benches/open_close.c
 *     /tmp/open_close MNT/f 100000
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec + now.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 3 || atoi(argv[2]) <= 0) {
        fprintf(stderr, "usage: %s FILE N\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    int rounds = atoi(argv[2]);
    double start = seconds();
    for (int i = 0; i < rounds; i++) {
        int fd = open(path, O_RDONLY);
        if (fd < 0) {
            perror(path);
            return 1;
        }
        close(fd);
    }
    printf("%s: %.2f us per open and close\n", path, (seconds() - start) / rounds * 1e6);
    return 0;
}
