/* A demo of the exported model's API (polyc/runtime/templates/model_demo.c): reads each input
   from a .npy file (C order, the input's element type and shape), runs the model and writes
   each output as OUTPUT_NAME.npy.

       ./${prefix}_demo [-w ${default_weights}] [-o DIRECTORY] [-t THREADS] [-r REPEAT] INPUT.npy ...

   -r REPEAT runs the model that many times more and prints the median time of a run. */
#include "${prefix}.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "${prefix}_demo: %s%s\n", what, detail);
    exit(1);
}

/* The value of `key` in a .npy header's dictionary text, from just after its colon. */
static const char *npy_field(const char *header, const char *key)
{
    const char *at = strstr(header, key);
    if (at == NULL)
        return NULL;
    at = strchr(at + strlen(key), ':');
    if (at == NULL)
        return NULL;
    at++;
    while (*at == ' ')
        at++;
    return at;
}

/* Reads `path` into a new buffer after checking its element type and shape against `tensor`. */
static void *read_npy(const char *path, const ${prefix}_tensor_t *tensor)
{
    FILE *file = fopen(path, "rb");
    if (file == NULL)
        die("cannot open ", path);
    unsigned char start[10];
    if (fread(start, 1, 10, file) != 10 || memcmp(start, "\x93NUMPY", 6) != 0)
        die("not a .npy file: ", path);
    size_t header_bytes = start[8] | (size_t)start[9] << 8;
    if (start[6] >= 2) {  /* versions 2 and 3: a 4-byte header length */
        unsigned char more[2];
        if (fread(more, 1, 2, file) != 2)
            die("truncated .npy header: ", path);
        header_bytes |= (size_t)more[0] << 16 | (size_t)more[1] << 24;
    }
    char *header = (char *)malloc(header_bytes + 1);
    if (header == NULL || fread(header, 1, header_bytes, file) != header_bytes)
        die("truncated .npy header: ", path);
    header[header_bytes] = '\0';
    const char *descr = npy_field(header, "'descr'");
    const char *fortran = npy_field(header, "'fortran_order'");
    const char *shape = npy_field(header, "'shape'");
    char expected[64];
    snprintf(expected, sizeof expected, "'%s'", tensor->npy_descr);
    if (descr == NULL || strncmp(descr, expected, strlen(expected)) != 0) {
        fprintf(stderr, "${prefix}_demo: %s: input %s must have element type %s (.npy descr %s)\n", path,
                tensor->name, tensor->dtype, tensor->npy_descr);
        exit(1);
    }
    if (fortran == NULL || strncmp(fortran, "False", 5) != 0)
        die("the array must be in C order (fortran_order False): ", path);
    if (shape == NULL || *shape != '(')
        die("no shape in the .npy header: ", path);
    shape++;
    for (int k = 0; k < tensor->rank; k++) {
        char *end;
        long long extent = strtoll(shape, &end, 10);
        if (end == shape || extent != tensor->shape[k]) {
            fprintf(stderr, "${prefix}_demo: %s: input %s must have shape (", path, tensor->name);
            for (int j = 0; j < tensor->rank; j++)
                fprintf(stderr, "%s%lld", j ? ", " : "", (long long)tensor->shape[j]);
            fprintf(stderr, ")\n");
            exit(1);
        }
        shape = end;
        while (*shape == ',' || *shape == ' ')
            shape++;
    }
    if (*shape != ')')
        die("the array has more dimensions than the input: ", path);
    free(header);
    void *data = malloc(tensor->bytes > 0 ? tensor->bytes : 1);
    if (data == NULL)
        die("out of memory reading ", path);
    if (fread(data, 1, tensor->bytes, file) != tensor->bytes)
        die("truncated .npy data: ", path);
    fclose(file);
    return data;
}

static void write_npy(const char *directory, const ${prefix}_tensor_t *tensor, const void *data)
{
    char path[4096], header[512];
    char name[256];
    size_t n = 0;
    for (const char *c = tensor->name; *c != '\0' && n + 1 < sizeof name; c++)  /* a file name of the output's */
        name[n++] = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-'
                        || *c == '.' ? *c : '_';
    name[n] = '\0';
    snprintf(path, sizeof path, "%s/%s.npy", directory, name);
    int length = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                          tensor->npy_descr);
    for (int k = 0; k < tensor->rank; k++)
        length += snprintf(header + length, sizeof header - length, "%lld%s", (long long)tensor->shape[k],
                           tensor->rank == 1 ? "," : k + 1 < tensor->rank ? ", " : "");
    length += snprintf(header + length, sizeof header - length, "), }");
    const int total = (10 + length + 1 + 63) / 64 * 64;  /* the header ends with '\n' at a multiple of 64 */
    while (10 + length + 1 < total)
        header[length++] = ' ';
    header[length++] = '\n';
    FILE *file = fopen(path, "wb");
    if (file == NULL)
        die("cannot write ", path);
    const unsigned char start[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(length & 0xff),
                                     (unsigned char)(length >> 8)};
    if (fwrite(start, 1, 10, file) != 10 || fwrite(header, 1, (size_t)length, file) != (size_t)length
        || fwrite(data, 1, tensor->bytes, file) != tensor->bytes)
        die("cannot write ", path);
    fclose(file);
    printf("%s\n", path);
}

static double seconds_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const char *weights = NULL, *directory = ".";
    int threads = 0, repeat = 0, count = 0;
    const char *paths[${PREFIX}_NUM_INPUTS + 1];
    for (int k = 1; k < argc; k++) {
        if (strcmp(argv[k], "-w") == 0 && k + 1 < argc)
            weights = argv[++k];
        else if (strcmp(argv[k], "-o") == 0 && k + 1 < argc)
            directory = argv[++k];
        else if (strcmp(argv[k], "-t") == 0 && k + 1 < argc)
            threads = atoi(argv[++k]);
        else if (strcmp(argv[k], "-r") == 0 && k + 1 < argc)
            repeat = atoi(argv[++k]);
        else if (argv[k][0] == '-' && argv[k][1] != '\0')
            die("unknown option ", argv[k]);
        else if (count < ${PREFIX}_NUM_INPUTS)
            paths[count++] = argv[k];
        else
            die("too many inputs: the model takes ${num_inputs}; extra: ", argv[k]);
    }
    if (count != ${PREFIX}_NUM_INPUTS) {
        fprintf(stderr, "usage: %s [-w WEIGHTS] [-o DIRECTORY] [-t THREADS] [-r REPEAT]", argv[0]);
        for (int k = 0; k < ${PREFIX}_NUM_INPUTS; k++)
            fprintf(stderr, " %s.npy", ${prefix}_input(k)->name);
        fprintf(stderr, "\n");
        return 2;
    }
    ${prefix}_t *model = ${prefix}_create(weights);
    if (${prefix}_error(model))
        die("", ${prefix}_error_message(model));
    ${prefix}_set_threads(model, threads);
    const void *inputs[${PREFIX}_NUM_INPUTS + 1];
    void *outputs[${PREFIX}_NUM_OUTPUTS + 1];
    for (int k = 0; k < ${PREFIX}_NUM_INPUTS; k++)
        inputs[k] = read_npy(paths[k], ${prefix}_input(k));
    for (int k = 0; k < ${PREFIX}_NUM_OUTPUTS; k++) {
        outputs[k] = malloc(${prefix}_output(k)->bytes > 0 ? ${prefix}_output(k)->bytes : 1);
        if (outputs[k] == NULL)
            die("out of memory", "");
    }
    if (${prefix}_run(model, inputs, outputs) != ${PREFIX}_OK)
        die("", ${prefix}_error_message(model));
    if (repeat > 0) {
        double *times = (double *)malloc(sizeof(double) * (size_t)repeat);
        for (int r = 0; r < repeat; r++) {
            const double started = seconds_now();
            if (${prefix}_run(model, inputs, outputs) != ${PREFIX}_OK)
                die("", ${prefix}_error_message(model));
            times[r] = seconds_now() - started;
        }
        qsort(times, (size_t)repeat, sizeof(double), by_value);
        fprintf(stderr, "median of %d runs: %.6f s\n", repeat, times[repeat / 2]);
        free(times);
    }
    for (int k = 0; k < ${PREFIX}_NUM_OUTPUTS; k++)
        write_npy(directory, ${prefix}_output(k), outputs[k]);
    for (int k = 0; k < ${PREFIX}_NUM_INPUTS; k++)
        free((void *)inputs[k]);
    for (int k = 0; k < ${PREFIX}_NUM_OUTPUTS; k++)
        free(outputs[k]);
    ${prefix}_destroy(model);
    return 0;
}
