"""ListTransactions (key 66), v0: ``kafka-transactions.sh list``. The transactional ids this broker
coordinates, filtered by state names (unknown names are returned in unknown_state_filters) and producer ids,
as Kafka's TransactionStateManager.listTransactionStates; COORDINATOR_LOAD_IN_PROGRESS while a partition
loads."""

from __future__ import annotations

from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._authorize import AclOperation, ResourceType, allowed_names
from pykbroker.server.handlers._build import make, response_module


@handles(66)
def list_transactions(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    error, unknown, found = ctx.broker.transactions.list_transactions(list(request.state_filters),
                                                                     [int(p) for p in request.producer_id_filters])
    # only the ids the principal may DESCRIBE, as Kafka
    visible = allowed_names(ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID,
                            (m.transactional_id for m in found), log_if_denied=False)
    return make(schema.ListTransactionsResponse, throttle_time=0, error_code=error, unknown_state_filters=tuple(unknown),
                transaction_states=tuple(
                    make(schema.TransactionState, transactional_id=m.transactional_id, producer_id=m.producer_id,
                         transaction_state=m.state.state_name)
                    for m in found if m.transactional_id in visible))
