// The Adam loops for the avx512 instruction set (compile flags set in CMakeLists.txt).
#define RZ_ISA_NS adam_avx512
#define RZ_TABLE_FN adam_table_avx512
#include "adam_kernels.inc"
