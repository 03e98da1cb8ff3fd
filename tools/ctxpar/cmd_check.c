// `ctxpar check`: context-parallel attention on generated inputs against the fp64 oracle and
// P = 1.
#include "commands.h"
#include "report.h"

int cpt_cmd_check(int argc, char **argv) {
    cpt_cli cli;
    int rc = cpt_cli_parse("check", argc, argv, &cli, stdout, stderr);
    if (rc >= 0)
        return rc;
    cpt_session s;
    if ((rc = cpt_session_begin(&s, "check", &cli)) >= 0)
        return rc;
    cli.cfg.keep_oracle = cli.report_path != NULL; // --report judges the outputs row by row
    cpt_run_result r;
    if (cpt_session_run(&s, &cli.cfg, 1, &r) != CTXPAR_OK)
        return cpt_session_end(&s, CPT_EXIT_USAGE);
    if (s.rank == 0) {
        if (cli.json) {
            fputc('{', stdout);
            cpt_report_json_members(stdout, &cli.cfg, &r);
            fputs("}\n", stdout);
        } else if (r.status == CTXPAR_OK) { // else the one line below says it all
            cpt_report_table(stdout, "check", &cli.cfg, &r, 0);
        }
    }
    if (r.status != CTXPAR_OK && !cli.json)
        cpt_session_error(&s, "%s", r.message);
    rc = cpt_exit_code(&r);
    const cpt_audit_layout lay = cpt_audit_layout_of(&cli);
    rc = cpt_report_judged(&s, &cli, &lay, &r, NULL, rc);
    cpt_run_result_free(&r);
    return cpt_session_end(&s, rc);
}
