"""What a held attempt does outside the coordinator: effect records (prepare, record, a claim held
for approval), owned reconciliation of UNKNOWN effects, and managed jobs bound to the attempt."""
