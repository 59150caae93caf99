#include <cstdio>
int main() { std::puts("trainer: under construction"); return 0; }
