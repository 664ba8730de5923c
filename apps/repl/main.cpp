// actorgraph: the interactive REPL (see docs/REPL.md).
#include "apps/repl/console.hpp"

int main(int argc, char** argv) { return ag::repl::console_main(argc, argv); }
