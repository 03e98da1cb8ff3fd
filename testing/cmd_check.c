// `ctxpar check`: context-parallel attention on generated inputs against the fp64 oracle and
// P = 1.
#include "commands.h"

int ctxpar_cmd_check(int argc, char **argv) {
    ctxpar_cli cli;
    int rc = ctxpar_cli_parse("check", argc, argv, &cli, stdout, stderr);
    if (rc >= 0)
        return rc;
    ctxpar_session s;
    if ((rc = ctxpar_session_begin(&s, "check", &cli)) >= 0)
        return rc;
    ctxpar_run_result r;
    if (ctxpar_session_run(&s, &cli.cfg, 1, &r) != CTXPAR_OK)
        return ctxpar_session_end(&s, CTXPAR_EXIT_USAGE);
    if (s.rank == 0) {
        if (cli.json) {
            fputc('{', stdout);
            ctxpar_report_json_members(stdout, &cli.cfg, &r);
            fputs("}\n", stdout);
        } else if (r.status == CTXPAR_OK) { // else the one line below says it all
            ctxpar_report_table(stdout, "check", &cli.cfg, &r);
        }
    }
    if (r.status != CTXPAR_OK && !cli.json)
        ctxpar_session_error(&s, "%s", r.message);
    rc = ctxpar_exit_code(&r);
    ctxpar_run_result_free(&r);
    return ctxpar_session_end(&s, rc);
}
